-- Kept as a version number only. Until issue 28 this file built messenger-side indexes
-- with a plain CREATE INDEX (a lock on the messenger's hot tables). They are now declared
-- in supervision/schema_contract.py (INDEXES, with why each is needed) and built by
-- `safetynet migrate` CONCURRENTLY, outside a transaction, under a short lock_timeout,
-- reusing an equivalent index under any name and rebuilding an INVALID leftover. A
-- database migrated before keeps this version under the old file's checksum
-- (supervision/migrate.py, LEGACY_CHECKSUMS).
SELECT 1;
