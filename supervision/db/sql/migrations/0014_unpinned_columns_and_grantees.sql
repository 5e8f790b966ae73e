-- Issue 36, item 1: no safetynet function pins a messenger column.
--
-- Migration 0011 gave safetynet.finalize_classify a SQL-standard body (BEGIN ATOMIC). Such
-- a body is stored parsed, and PostgreSQL records a dependency on every column it names:
-- 13 columns of call_recordings, call_sessions and conference_sessions. The messenger's
-- own migrations then failed on them — `ALTER COLUMN status TYPE varchar(64)` ("cannot
-- alter type of a column used by a function or procedure"), a rename kept the function
-- bound to the old column, `DROP COLUMN` needed CASCADE (dropping the function).
--
-- A PL/pgSQL body is kept as text and planned at its first call in each session: it
-- records no dependency on what it reads, so the messenger may change, rename or drop a
-- column freely (a broken contract is then check-schema's and the start-up gate's to
-- report, docs/contract.md). Names are still never resolved through the caller's
-- search_path (issue #26): the function pins `SET search_path = pg_catalog, pg_temp` and
-- names every table and function by its schema. It is not inlined into the claim any
-- more (a function with a SET clause never is): the claim and `safetynet plan` call it
-- once per due row, as a function scan of one row (ROWS 1), each call three index probes
-- by primary key, as before.
--
-- conference_phase keeps its BEGIN ATOMIC body: it reads only its arguments, so it pins
-- nothing of the messenger's. The NOTIFY trigger (messenger-side, installed by migrate)
-- depends on integration_outbox as a whole and on no column.
CREATE OR REPLACE FUNCTION safetynet.finalize_classify(
    p_recording_id uuid, p_as_of timestamptz, p_sla float8, p_recheck float8)
RETURNS TABLE (found_recording_id uuid, recording_status text, tenant_id uuid,
               session_ended_at timestamptz, phase text, poison_reason text)
LANGUAGE plpgsql STABLE
ROWS 1
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    SELECT r.id::uuid, r.status::text, r.tenant_id::uuid, s.ended_at,
           CASE
               WHEN r.id IS NULL THEN 'poison'
               WHEN r.status::text IN ('Available', 'Failed') THEN 'terminal'
               WHEN s.problem IS NOT NULL THEN 'poison'
               WHEN s.ended_at IS NULL
                    OR s.ended_at > p_as_of - p_sla * interval '1 second' THEN 'wait'
               ELSE 'reconcile'
           END,
           CASE
               WHEN r.id IS NULL THEN 'recording_missing'
               WHEN r.status::text NOT IN ('Available', 'Failed') THEN s.problem
           END
    FROM (SELECT p_recording_id AS id) k
    LEFT JOIN messenger.call_recordings r ON r.id = k.id
    LEFT JOIN LATERAL (
        SELECT e.ended_at,
               CASE
                   WHEN r.session_kind::text NOT IN ('Direct', 'Conference')
                       THEN 'session_kind_unknown:'
                            || pg_catalog.left(r.session_kind::text, 32)
                   WHEN e.status IS NULL THEN 'session_missing'
                   WHEN e.ended_at > p_as_of + (p_sla + p_recheck) * interval '1 second'
                       THEN 'session_ended_in_future:'
                            || pg_catalog.to_char(e.ended_at AT TIME ZONE 'UTC',
                                                  'YYYY-MM-DD"T"HH24:MI:SS"Z"')
               END AS problem
        FROM (SELECT pg_catalog.max(x.status) AS status,
                     pg_catalog.max(COALESCE(x.ended_at,
                                             CASE WHEN x.status IN ('Ended', 'Failed')
                                                  THEN x.updated_at END)) AS ended_at
              FROM (SELECT cs.status::text AS status, cs.ended_at::timestamptz AS ended_at,
                           cs.updated_at::timestamptz AS updated_at
                    FROM messenger.call_sessions cs
                    WHERE r.session_kind::text = 'Direct' AND cs.id = r.session_id
                    UNION ALL
                    SELECT cf.status::text, cf.ended_at::timestamptz, cf.updated_at::timestamptz
                    FROM messenger.conference_sessions cf
                    WHERE r.session_kind::text = 'Conference' AND cf.id = r.session_id) x) e
    ) s ON r.id IS NOT NULL;
END;
$$;

-- Issue 36, item 2: grants that survive upgrades. `migrate --grant-to ROLE` (runtime) and
-- `--grant-read-to ROLE` (read-only) record the role here; every later `migrate` (the
-- Kubernetes Job included, which runs without the flag) grants each recorded role again,
-- so tables and functions a later migration adds reach it, and the per-column grants on
-- messenger tables follow the contract of the build that migrates. digest: a hash of the
-- grants last applied (migrate skips a role whose grants are unchanged and no migration
-- ran). No role but the owner may write it: a runtime role that could add a name here
-- would have the next migrate grant that name its privileges.
CREATE TABLE safetynet.grantees (
    role_name text PRIMARY KEY CHECK (char_length(role_name) <= 63),
    access text NOT NULL CHECK (access IN ('runtime', 'read')),
    digest text NULL CHECK (char_length(digest) <= 64),
    granted_at timestamptz NOT NULL DEFAULT pg_catalog.now()
);
