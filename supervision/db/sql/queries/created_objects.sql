-- name: created_objects_exists --
-- Whether the record exists yet (NULL before migration 0017).
SELECT pg_catalog.to_regclass('safetynet.created_objects');

-- name: created_objects_list --
-- What safetynet created on the messenger's tables (uninstall removes exactly these).
SELECT kind, name, table_name FROM safetynet.created_objects ORDER BY kind, name;

-- name: created_objects_record --
INSERT INTO safetynet.created_objects (kind, name, table_name, how)
VALUES (%(kind)s, %(name)s, %(table)s, %(how)s)
ON CONFLICT (kind, name) DO NOTHING;

-- name: created_objects_forget --
DELETE FROM safetynet.created_objects WHERE kind = %(kind)s AND name = %(name)s;

-- name: created_objects_newer_indexes --
-- The messenger's indexes created after the safetynet schema (OIDs are handed out in
-- order): an index the messenger had before the install is never among them.
SELECT i.relname
FROM pg_catalog.pg_class i
JOIN pg_catalog.pg_namespace n ON n.oid = i.relnamespace
WHERE n.nspname = 'messenger' AND i.relkind = 'i'
  AND i.oid > (SELECT s.oid FROM pg_catalog.pg_namespace s WHERE s.nspname = 'safetynet');

-- name: created_objects_trigger_is_ours --
-- The NOTIFY trigger, when it calls safetynet's function.
SELECT 1 FROM pg_catalog.pg_trigger t
WHERE t.tgrelid = pg_catalog.to_regclass('messenger.integration_outbox')
  AND t.tgname = 'trg_integration_outbox_notify'
  AND t.tgfoid = pg_catalog.to_regprocedure('safetynet.notify_outbox()');

-- name: created_objects_drop_schema --
-- uninstall's last step: safetynet's tables, functions and this record, with the schema
-- (the trigger and the indexes on the messenger's tables are gone by then).
DROP SCHEMA IF EXISTS safetynet CASCADE;

-- name: created_objects_sessions_left --
-- safetynet's own sessions still on this database (uninstall refuses while a replica, the
-- console or a verb runs): their application_name, how many.
SELECT application_name, count(*)
FROM pg_catalog.pg_stat_activity
WHERE datname = pg_catalog.current_database() AND pid <> pg_catalog.pg_backend_pid()
  AND application_name IN ('safetynet', 'safetynet-lock', 'safetynet-listen',
                           'safetynet-console', 'safetynet-cli', 'safetynet-migrate')
GROUP BY application_name
ORDER BY application_name;
