-- Issue 36, item 5: the operator trail is evidence.
--
-- Until now a role allowed to INSERT into safetynet.operator_actions (the runtime role)
-- could write its own `at`, `db_user` and (OVERRIDING SYSTEM VALUE) `id`, and ids and a
-- result of any size. From here on the database sets those three itself, whatever the
-- INSERT says, and refuses a row whose ids are not of the type their verb names or whose
-- fields exceed their bounds. Rows written before this migration are left as they are
-- (the table is append-only: they cannot be rewritten).
--
-- * `id` comes from a sequence of its own that only the trigger below draws from: the
--   identity column accepted any value under OVERRIDING SYSTEM VALUE. The trigger runs as
--   the function's owner (SECURITY DEFINER, search_path pinned) because no other role is
--   granted the sequence, so no one but the owner can burn or reset ids.
-- * `at` is the inserting transaction's now(); `db_user` its session_user (the login,
--   also under SET ROLE).
-- * ids: at most 1000 of them (a purge batch), each of the type its verb acts on —
--   a uuid (requeue, release), a bigint outbox id (replay, purge-dead-letters,
--   release-key), a job
--   name (pause, resume) — or, for any other verb, text of at most 1400 characters (an
--   `s3://bucket/prefix` location); `result` at most 256 KiB as text.
-- What a table owner can still do is in docs/console.md ("The operator trail").

-- squawk's ban-alter-identity warns that inserts naming no id would break: here the
-- trigger below gives every row its id, so an INSERT of an earlier release still works.
-- squawk-ignore ban-alter-identity
ALTER TABLE safetynet.operator_actions ALTER COLUMN id DROP IDENTITY;

CREATE SEQUENCE safetynet.operator_actions_id_seq AS bigint
    OWNED BY safetynet.operator_actions.id;

SELECT pg_catalog.setval('safetynet.operator_actions_id_seq',
                         COALESCE(pg_catalog.max(id), 0) + 1, false)
FROM safetynet.operator_actions;

-- no one but the owner may draw from it or reset it (whatever default privileges gave)
DO $$
DECLARE
    grantee regrole;
BEGIN
    REVOKE ALL ON SEQUENCE safetynet.operator_actions_id_seq FROM PUBLIC;
    FOR grantee IN
        SELECT DISTINCT a.grantee::regrole
        FROM pg_catalog.pg_class c, pg_catalog.aclexplode(c.relacl) a
        WHERE c.oid = 'safetynet.operator_actions_id_seq'::regclass
          AND a.grantee <> c.relowner AND a.grantee <> 0
    LOOP
        EXECUTE pg_catalog.format(
            'REVOKE ALL ON SEQUENCE safetynet.operator_actions_id_seq FROM %s', grantee);
    END LOOP;
END;
$$;

CREATE FUNCTION safetynet.operator_actions_stamp() RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    one text;
    kind text := CASE
        WHEN NEW.verb IN ('requeue', 'release') THEN 'uuid'
        WHEN NEW.verb IN ('replay', 'purge-dead-letters', 'release-key') THEN 'bigint'
        WHEN NEW.verb IN ('pause', 'resume') THEN 'job'
        ELSE 'text'
    END;
    ok boolean;
BEGIN
    NEW.id := pg_catalog.nextval('safetynet.operator_actions_id_seq'::pg_catalog.regclass);
    NEW.at := pg_catalog.now();
    NEW.db_user := session_user;
    IF NEW.ids IS NULL THEN
        NEW.ids := '{}';
    END IF;
    IF pg_catalog.cardinality(NEW.ids) > 1000 THEN
        RAISE EXCEPTION 'safetynet.operator_actions.ids: % ids, at most 1000',
            pg_catalog.cardinality(NEW.ids) USING ERRCODE = 'check_violation';
    END IF;
    FOREACH one IN ARRAY NEW.ids LOOP
        ok := CASE kind
            WHEN 'uuid' THEN
                one ~ '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'
            WHEN 'bigint' THEN one ~ '^(0|[1-9][0-9]{0,18})$'
            WHEN 'job' THEN one ~ '^[a-z0-9-]{1,64}$'
            ELSE pg_catalog.char_length(one) BETWEEN 1 AND 1400
        END;
        IF ok AND kind = 'bigint' THEN
            ok := one::numeric <= 9223372036854775807;
        END IF;
        IF ok IS NOT TRUE THEN
            RAISE EXCEPTION 'safetynet.operator_actions.ids: an id that is not a % (verb %)',
                kind, NEW.verb USING ERRCODE = 'check_violation';
        END IF;
    END LOOP;
    IF pg_catalog.octet_length(NEW.result::text) > 262144 THEN
        RAISE EXCEPTION 'safetynet.operator_actions.result: % bytes, at most 262144',
            pg_catalog.octet_length(NEW.result::text) USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END;
$$;

CREATE TRIGGER trg_operator_actions_stamp
    BEFORE INSERT ON safetynet.operator_actions
    FOR EACH ROW EXECUTE FUNCTION safetynet.operator_actions_stamp();
