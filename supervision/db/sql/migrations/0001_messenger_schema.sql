-- Kept as a version number only. Until issue 28 this file created the messenger's tables;
-- they are the messenger's (its own migrations create them; supervision/dev/
-- messenger_fixture.sql for the demo, the tests and the benches). A database migrated
-- before keeps this version in its ledger under the old file's checksum, which
-- supervision/migrate.py recognises (LEGACY_CHECKSUMS). The safetynet schema itself is
-- created with the ledger (supervision/sql/queries/schema_migrations.sql).
SELECT 1;
