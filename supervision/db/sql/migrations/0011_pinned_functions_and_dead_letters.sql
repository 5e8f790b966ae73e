-- Issue #26, items 3 and 4.
--
-- 1. No safetynet function resolves a name through the caller's search_path. A role with
--    CREATE on a schema the caller searches (public, by default up to PostgreSQL 14)
--    could otherwise plant public.left(varchar, int) and have it run with the daemon's
--    privileges from inside safetynet.finalize_classify.
--    * the PL/pgSQL functions pin `SET search_path = pg_catalog, pg_temp` and call
--      pg_catalog.* by its qualified name;
--    * the two SQL functions the claims inline (finalize_classify, conference_phase) get
--      SQL-standard bodies (BEGIN ATOMIC) instead: such a body is parsed once, here, and
--      stored with every function and operator already resolved (this migration runs
--      with search_path pinned, supervision/migrate.py), so no search_path is consulted
--      when they run. A `SET` clause would do the same for a string body, but the
--      planner never inlines a function that has one, and the claims depend on the
--      inlining (migrations 0004, 0007). Their calls are qualified all the same.
--    The daemon's and the CLI's sessions pin their own search_path too
--    (supervision/pgconn.py), and docs/operations.md tells DBAs to revoke CREATE on
--    public.
--
-- 2. Dead letters leave the unpublished path. A dead-lettered outbox row stays
--    unpublished for ever (until `safetynet replay` or the purge): at a million of them
--    every claim, idle probe and gauge walked them through ix_outbox_unpublished. The
--    relay now marks such a row's last_error with the prefix 'dead-letter:' (the row's
--    own columns are all a partial index can see), and ix_outbox_live holds only the
--    unpublished rows without it.

CREATE OR REPLACE FUNCTION safetynet.notify_outbox() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- delivered at COMMIT, once per transaction however many rows it wrote
    PERFORM pg_catalog.pg_notify('safetynet_outbox', '');
    RETURN NULL;
END;
$$;

CREATE OR REPLACE FUNCTION safetynet.finalize_classify(
    p_recording_id uuid, p_as_of timestamptz, p_sla float8, p_recheck float8)
RETURNS TABLE (found_recording_id uuid, recording_status text, tenant_id uuid,
               session_ended_at timestamptz, phase text, poison_reason text)
LANGUAGE sql STABLE
BEGIN ATOMIC
    SELECT r.id, r.status::text, r.tenant_id, s.ended_at,
           CASE
               WHEN r.id IS NULL THEN 'poison'
               WHEN r.status IN ('Available', 'Failed') THEN 'terminal'
               WHEN s.problem IS NOT NULL THEN 'poison'
               WHEN s.ended_at IS NULL
                    OR s.ended_at > p_as_of - p_sla * interval '1 second' THEN 'wait'
               ELSE 'reconcile'
           END,
           CASE
               WHEN r.id IS NULL THEN 'recording_missing'
               WHEN r.status NOT IN ('Available', 'Failed') THEN s.problem
           END
    FROM (SELECT p_recording_id AS id) k
    LEFT JOIN messenger.call_recordings r ON r.id = k.id
    LEFT JOIN LATERAL (
        SELECT e.ended_at,
               CASE
                   WHEN r.session_kind NOT IN ('Direct', 'Conference')
                       THEN 'session_kind_unknown:' || pg_catalog.left(r.session_kind, 32)
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
              FROM (SELECT cs.status, cs.ended_at, cs.updated_at
                    FROM messenger.call_sessions cs
                    WHERE r.session_kind = 'Direct' AND cs.id = r.session_id
                    UNION ALL
                    SELECT cf.status, cf.ended_at, cf.updated_at
                    FROM messenger.conference_sessions cf
                    WHERE r.session_kind = 'Conference' AND cf.id = r.session_id) x) e
    ) s ON r.id IS NOT NULL;
END;

CREATE OR REPLACE FUNCTION safetynet.lease_acquire(p_job text, p_holder text, p_ttl float8)
RETURNS TABLE (term bigint, previous_holder text, previous_state text)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    cur safetynet.leases%ROWTYPE;
    now_ timestamptz := pg_catalog.clock_timestamp();
BEGIN
    INSERT INTO safetynet.leases AS l (job, holder, holder_pid, term, acquired_at, expires_at)
    VALUES (p_job, '', 0, 0, now_, '-infinity')
    ON CONFLICT (job) DO NOTHING;
    SELECT * INTO cur FROM safetynet.leases l WHERE l.job = p_job FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN;  -- a fenced transaction of the live term is in flight
    END IF;
    IF cur.expires_at > now_ AND EXISTS (
            SELECT 1 FROM pg_catalog.pg_stat_activity a WHERE a.pid = cur.holder_pid) THEN
        RETURN;  -- held, and its holder's session is alive
    END IF;
    UPDATE safetynet.leases l
       SET holder = p_holder, holder_pid = pg_catalog.pg_backend_pid(), term = cur.term + 1,
           acquired_at = now_, expires_at = now_ + p_ttl * interval '1 second'
     WHERE l.job = p_job;
    term := cur.term + 1;
    previous_holder := NULLIF(cur.holder, '');
    previous_state := CASE WHEN cur.expires_at = '-infinity' THEN 'released'
                           WHEN cur.expires_at <= now_ THEN 'expired'
                           ELSE 'session_gone' END;
    RETURN NEXT;
END;
$$;

CREATE OR REPLACE FUNCTION safetynet.lease_fence(p_job text, p_term bigint)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM 1 FROM safetynet.leases l
     WHERE l.job = p_job AND l.term = p_term AND l.expires_at > pg_catalog.clock_timestamp()
       FOR KEY SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'lease lost: % term % is no longer the live term', p_job, p_term
            USING ERRCODE = 'SN001';
    END IF;
END;
$$;

CREATE OR REPLACE FUNCTION safetynet.conference_phase(
    p_status text, p_active_participant_count int, p_last_activity_at timestamptz,
    p_created_at timestamptz, p_as_of timestamptz, p_empty_room_grace float8,
    p_provision_timeout float8, p_stale_live_timeout float8)
RETURNS text
LANGUAGE sql STABLE
BEGIN ATOMIC
    SELECT CASE
        WHEN p_status = 'Active' AND p_active_participant_count = 0
             AND p_last_activity_at <= p_as_of - p_empty_room_grace * interval '1 second'
            THEN 'empty-room'
        WHEN p_status = 'Provisioning'
             AND p_created_at <= p_as_of - p_provision_timeout * interval '1 second'
            THEN 'provision-timeout'
        WHEN p_status = 'Active'
             AND p_last_activity_at <= p_as_of - p_stale_live_timeout * interval '1 second'
            THEN 'stale-live'
    END;
END;

-- Dead letters of older versions: their rows get the prefix, so the index below leaves
-- them out (the queries also check safetynet.outbox_dead_letters itself).
UPDATE messenger.integration_outbox o
SET last_error = pg_catalog.left('dead-letter: ' || d.reason, 512)
FROM safetynet.outbox_dead_letters d
WHERE d.outbox_id = o.id AND o.published_at IS NULL
  AND (o.last_error IS NULL OR NOT o.last_error ^@ 'dead-letter:');

-- The dead letters that hold back later rows of their key (the claim's and the blocked-
-- keys gauge's probe; usually none), and the dead letters by age (the purge).
CREATE INDEX ix_dead_letters_blocking ON safetynet.outbox_dead_letters (topic, message_key, outbox_id)
    WHERE blocks_key;
CREATE INDEX ix_dead_letters_created ON safetynet.outbox_dead_letters (created_at, outbox_id);

-- The relay's path, unpublished rows that are not dead letters, is the messenger-side
-- index ix_outbox_live: like every index on a messenger table it is declared in
-- supervision/schema_contract.py (INDEXES) and built by `safetynet migrate` with
-- CREATE INDEX CONCURRENTLY outside any transaction, never by a ledger migration.
