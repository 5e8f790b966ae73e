-- name: schema_migrations_lock --
-- Serialises concurrent `safetynet migrate` runs for the length of the transaction.
SELECT pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtext('safetynet.migrate'));

-- name: schema_migrations_pin_search_path --
-- Every migration runs with only pg_catalog on its search_path: a function or operator
-- planted in a schema the session would search (public) is never what a migration's
-- statements, or the SQL-standard function bodies they store, resolve to (issue #26).
SET LOCAL search_path = pg_catalog, pg_temp;

-- name: schema_migrations_create_schema --
-- Only when the schema is missing (the first install): CREATE SCHEMA needs CREATE on the
-- database, which an upgrade must not need, even with IF NOT EXISTS.
CREATE SCHEMA IF NOT EXISTS safetynet;

-- name: schema_migrations_create --
-- Only when the ledger is missing (CREATE TABLE, even IF NOT EXISTS, needs CREATE on the
-- schema).
CREATE TABLE IF NOT EXISTS safetynet.schema_migrations (
    version int PRIMARY KEY,
    name text NOT NULL,
    checksum text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- name: schema_migrations_list --
SELECT version, name, checksum FROM safetynet.schema_migrations ORDER BY version;

-- name: schema_migrations_insert --
INSERT INTO safetynet.schema_migrations (version, name, checksum) VALUES (%(version)s, %(name)s, %(checksum)s);

-- name: schema_migrations_session_setting --
-- migrate's per-statement bounds (lock_timeout before each lock-taking statement,
-- statement_timeout lifted around a concurrent index build); is_local: this transaction only.
SELECT set_config(%(name)s, %(value)s, %(is_local)s);

-- name: schema_migrations_schema_exists --
SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = 'safetynet';

-- name: schema_migrations_ledger_exists --
-- Whether the ledger exists yet (NULL before the first migrate).
SELECT pg_catalog.to_regclass('safetynet.schema_migrations');

-- name: schema_migrations_session_lock --
-- One migrate at a time across the whole run (index builds run outside transactions, so
-- the ledger's transaction-scoped lock does not cover them): a session-level lock.
SELECT pg_catalog.pg_advisory_lock(pg_catalog.hashtext('safetynet.migrate'));

-- name: schema_migrations_session_unlock --
SELECT pg_catalog.pg_advisory_unlock(pg_catalog.hashtext('safetynet.migrate'));

-- name: schema_migrations_serial_sequence --
-- The sequence behind a messenger table's serial id, which --grant-to grants USAGE on
-- (an INSERT's nextval() needs it); NULL for an identity column, which needs no grant.
SELECT pg_catalog.pg_get_serial_sequence(%(table)s, 'id')
FROM pg_catalog.pg_attribute
WHERE attrelid = pg_catalog.to_regclass(%(table)s) AND attname = 'id' AND attidentity = '';

-- name: schema_migrations_pin_session_search_path --
-- The DBA's psql session, as migrate's own: names resolve in pg_catalog only (index
-- predicates and function bodies bind as the migrations were written).
SET search_path = pg_catalog, pg_temp;

-- name: schema_migrations_reset_statement_timeout --
-- Back to the session's own statement_timeout after a messenger-side statement.
RESET statement_timeout;

-- name: schema_migrations_grantees_exist --
SELECT pg_catalog.to_regclass('safetynet.grantees');

-- name: schema_migrations_grantees_list --
-- The roles migrate grants to on every run (--grant-to, --grant-read-to), with the
-- digest of the grants last applied to each.
SELECT g.role_name, g.access, g.digest
FROM safetynet.grantees g
WHERE EXISTS (SELECT 1 FROM pg_catalog.pg_roles r WHERE r.rolname = g.role_name)
ORDER BY g.role_name;

-- name: schema_migrations_grantees_record --
INSERT INTO safetynet.grantees (role_name, access, digest)
VALUES (%(role)s, %(access)s, %(digest)s)
ON CONFLICT (role_name) DO UPDATE
SET access = EXCLUDED.access, digest = EXCLUDED.digest, granted_at = pg_catalog.now();

-- name: schema_migrations_role_exists --
SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = %(role)s;

-- name: schema_migrations_previous_grantees --
-- A database migrated before migration 0014 recorded grantees: the roles an earlier
-- release's --grant-to granted (INSERT on safetynet.leases, given explicitly, not its
-- owner's), which migrate adopts as runtime grantees so that they keep working.
SELECT DISTINCT r.rolname
FROM pg_catalog.pg_class c
CROSS JOIN LATERAL pg_catalog.aclexplode(c.relacl) a
JOIN pg_catalog.pg_roles r ON r.oid = a.grantee
WHERE c.oid = pg_catalog.to_regclass('safetynet.leases')
  AND a.privilege_type = 'INSERT' AND a.grantee <> c.relowner
ORDER BY 1;
