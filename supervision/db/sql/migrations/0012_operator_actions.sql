-- The trail of every operator action (issue #27): who did what, from where, to which ids,
-- why, and what came of it. Written by the mutating CLI verbs and by `safetynet console`
-- in the same transaction as the action itself; read by `safetynet history` and the
-- console's history page. Append-only: rows are never updated or deleted — the trigger
-- below refuses it whatever the role (an owner included), and the runtime role is granted
-- only INSERT and SELECT on it (docs/operations.md, "Operator trail").
CREATE TABLE safetynet.operator_actions (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at timestamptz NOT NULL DEFAULT now(),
    actor text CHECK (char_length(actor) <= 256) NOT NULL,  -- the OS user (cli), the login (console)
    db_user text NOT NULL DEFAULT session_user, -- the PostgreSQL role that wrote the row
    origin text NOT NULL CHECK (origin IN ('cli', 'console')),
    client text CHECK (char_length(client) <= 256) NULL,  -- the cli's host, the console's client address
    verb text CHECK (char_length(verb) <= 64) NOT NULL,
    ids text[] NOT NULL DEFAULT '{}',
    reason text CHECK (char_length(reason) <= 1024) NULL,
    result jsonb NOT NULL DEFAULT '{}'::jsonb
);
-- history pages newest first, keyset on id; --since on at
CREATE INDEX ix_operator_actions_at ON safetynet.operator_actions (at);

CREATE FUNCTION safetynet.operator_actions_append_only() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'safetynet.operator_actions is append-only (% refused)', TG_OP
        USING ERRCODE = 'SN002';
END;
$$;

CREATE TRIGGER trg_operator_actions_no_update
    BEFORE UPDATE OR DELETE ON safetynet.operator_actions
    FOR EACH ROW EXECUTE FUNCTION safetynet.operator_actions_append_only();
CREATE TRIGGER trg_operator_actions_no_truncate
    BEFORE TRUNCATE ON safetynet.operator_actions
    FOR EACH STATEMENT EXECUTE FUNCTION safetynet.operator_actions_append_only();

-- `safetynet pause --for 2h` and the console's pause form: a pause may end by itself.
-- The lock keeper's read (job_pauses_get) ignores a pause past its expiry, and a new pause
-- replaces an expired one.
ALTER TABLE safetynet.job_pauses ADD COLUMN expires_at timestamptz NULL;

-- The console's search by file id is served by ix_recording_file_id, a messenger-side
-- index declared in supervision/schema_contract.py and built CONCURRENTLY by migrate.
