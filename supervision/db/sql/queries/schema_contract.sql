-- name: schema_contract_columns --
-- The messenger's columns as check-schema compares them with supervision/db/schema_contract.py:
-- the base type's name and kind (a domain is judged by its base type), the declared width
-- of a varchar/char, NOT NULL, and whether the column fills itself (a default, an
-- identity or a generated column).
SELECT c.relname AS table, a.attname AS name,
       COALESCE(bt.typname, t.typname) AS type_name,
       CASE WHEN t.typtype = 'd' THEN bt.typtype ELSE t.typtype END::text AS type_kind,
       format_type(a.atttypid, a.atttypmod) AS formatted,
       CASE WHEN COALESCE(bt.typname, t.typname) IN ('varchar', 'bpchar')
                 AND COALESCE(nullif(a.atttypmod, -1), nullif(t.typtypmod, -1)) IS NOT NULL
            THEN COALESCE(nullif(a.atttypmod, -1), t.typtypmod) - 4 END AS width,
       a.attnotnull AS not_null,
       (a.atthasdef OR a.attidentity <> '' OR a.attgenerated <> '') AS has_default
FROM pg_attribute a
JOIN pg_class c ON c.oid = a.attrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
JOIN pg_type t ON t.oid = a.atttypid
LEFT JOIN pg_type bt ON t.typtype = 'd' AND bt.oid = t.typbasetype
WHERE n.nspname = 'messenger' AND c.relkind IN ('r', 'p') AND a.attnum > 0
  AND NOT a.attisdropped
ORDER BY c.relname, a.attnum;

-- name: schema_contract_indexes --
-- The messenger's indexes by definition: key columns (an expression shows as ''),
-- uniqueness, validity, access method and predicate.
SELECT i.relname AS name, t.relname AS table,
       array(SELECT COALESCE(a.attname, '')
             FROM unnest((x.indkey::int2[])[0:x.indnkeyatts - 1]) WITH ORDINALITY k(attnum, ord)
             LEFT JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = k.attnum
             ORDER BY k.ord) AS columns,
       x.indisunique AS unique, x.indisvalid AS valid, am.amname AS method,
       pg_get_expr(x.indpred, x.indrelid) AS predicate
FROM pg_index x
JOIN pg_class i ON i.oid = x.indexrelid
JOIN pg_class t ON t.oid = x.indrelid
JOIN pg_am am ON am.oid = i.relam
JOIN pg_namespace n ON n.oid = t.relnamespace
WHERE n.nspname = 'messenger';

-- name: schema_contract_outbox_trigger --
-- Whether the relay's NOTIFY trigger is on the outbox (migrate installs or drops it).
SELECT EXISTS (SELECT 1 FROM pg_trigger
               WHERE tgrelid = to_regclass('messenger.integration_outbox')
                 AND tgname = 'trg_integration_outbox_notify') AS present;

-- name: schema_contract_messenger_tables --
-- The messenger tables that exist (the fixture refuses to create any of them again).
SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'messenger' AND c.relkind IN ('r', 'p') ORDER BY 1;

-- name: schema_contract_session_settings --
-- The bounds every daemon session asks for in its startup packet (supervision.db.pgconn): a
-- transaction-mode pooler that drops the startup options leaves them at 0.
SELECT current_setting('statement_timeout') AS statement_timeout,
       current_setting('idle_in_transaction_session_timeout')
           AS idle_in_transaction_session_timeout;

-- name: schema_contract_index_invalid --
-- An INVALID messenger index of this name (a concurrent build that failed part way).
SELECT 1 FROM pg_index x
JOIN pg_class i ON i.oid = x.indexrelid
JOIN pg_namespace n ON n.oid = i.relnamespace
WHERE n.nspname = 'messenger' AND i.relname = %(name)s AND NOT x.indisvalid;
