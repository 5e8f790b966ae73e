-- name: finalize_attempts_claim_plan --
-- Run in the claim's transaction just before finalize_attempts_claim_due (reset at its
-- commit). The claim's windows are "the first batch_size due rows in ix_rfa_due order",
-- an index walk that stops after the batch. Under statistics from a quiet time (tables
-- analyzed while empty or while nothing was Pending, before autoanalyze has seen a
-- backlog: the seed's recorder outage) the planner believes a handful of rows match, and
-- prices a bitmap scan of every due row plus a sort of them below the walk: the whole
-- backlog read and sorted twice per claim (47-80 ms at 60,000 due rows against 3-6 ms,
-- docs/benchmarks.md). Without bitmap scans the only other way to that order is a
-- sequential scan and a sort, which costs the whole table whatever the statistics say, so
-- the walk wins; every other read of the claim is by key.
SET LOCAL enable_bitmapscan = off;

-- name: finalize_attempts_claim_due --
-- One short transaction per batch (after finalize_attempts_claim_plan). Takes up to batch_size due Pending rows in
-- next_attempt_at order (skipping rows another runner or an in-flight callback holds),
-- decides each row's phase from its recording and session, and
--   * for rows that are work now (reconcile, republish, terminal, poison): pre-increments
--     attempts and moves next_attempt_at by the back-off of that attempt;
--   * for recordings whose session has not ended, or ended less than the SLA ago: only
--     reschedules (not an attempt): to ended_at + SLA, or AsOf + recheck when not ended;
--   * rows that could only wait forever are poison with a reason (quarantined): no
--     recording, no session row, an unknown session_kind, an end far in the future.
--     A session Ended/Failed without ended_at counts as ended when it got that status.
-- Returns every claimed row with its phase and the values needed to undo the claim, and
-- (on every row, or on one all-NULL row when nothing was claimed) how many of the first
-- batch_size due rows were skipped because another transaction holds them.
--
-- While object storage is down (s3_down) only rows that need no HEAD are claimed: those
-- whose recording is Available/Failed already. Which due rows those are cannot be read
-- from one index (the status is call_recordings', the queue recording_finalize_attempts'),
-- so a batch looks at two bounded windows, 20 * batch_size rows each, never the backlog:
--   head:   the first due rows in ix_rfa_due order, each probed by call_recordings' key;
--   recent: the recordings that became terminal last (ix_recording_terminal_updated read
--           backwards: the ingest callback's Available recordings whose event is missing),
--           each probed by ux_rfa_recording.
-- A terminal recording in neither window (deep in a backlog of rows that need a HEAD,
-- and terminal before the latest 20 * batch_size) waits until object storage is back,
-- when the plain claim takes it in queue order. The two branches are gated by s3_down
-- (one-time filters): the other branch costs nothing.
WITH terminal AS MATERIALIZED (
    SELECT h.id
    FROM (SELECT a.id, a.recording_id
          FROM messenger.recording_finalize_attempts a
          WHERE %(s3_down)s AND a.status = 'Pending' AND a.next_attempt_at <= %(as_of)s
          ORDER BY a.next_attempt_at
          LIMIT 20 * %(batch_size)s) h
    JOIN messenger.call_recordings r ON r.id = h.recording_id
    WHERE r.status IN ('Available', 'Failed')
    UNION
    SELECT a.id
    FROM (SELECT r.id
          FROM messenger.call_recordings r
          WHERE %(s3_down)s AND r.status IN ('Available', 'Failed')
          ORDER BY r.updated_at DESC
          LIMIT 20 * %(batch_size)s) t
    JOIN messenger.recording_finalize_attempts a ON a.recording_id = t.id
    WHERE a.status = 'Pending' AND a.next_attempt_at <= %(as_of)s
),
candidates AS (
    (SELECT a.id
     FROM messenger.recording_finalize_attempts a
     WHERE NOT %(s3_down)s AND a.status = 'Pending' AND a.next_attempt_at <= %(as_of)s
     ORDER BY a.next_attempt_at  -- ix_rfa_due order: no sort of the whole backlog
     LIMIT %(batch_size)s)
    UNION ALL
    (SELECT a.id
     FROM messenger.recording_finalize_attempts a
     WHERE a.id IN (SELECT id FROM terminal)
       AND a.status = 'Pending' AND a.next_attempt_at <= %(as_of)s
     ORDER BY a.next_attempt_at
     LIMIT %(batch_size)s)
),
due_all AS (
    SELECT a.id, a.recording_id, a.attempts, a.next_attempt_at
    FROM messenger.recording_finalize_attempts a
    WHERE NOT %(s3_down)s AND a.status = 'Pending' AND a.next_attempt_at <= %(as_of)s
    ORDER BY a.next_attempt_at  -- ix_rfa_due order: no sort of the whole backlog
    LIMIT %(batch_size)s
    FOR UPDATE OF a SKIP LOCKED
),
due_terminal AS (
    SELECT a.id, a.recording_id, a.attempts, a.next_attempt_at
    FROM messenger.recording_finalize_attempts a
    WHERE a.id IN (SELECT id FROM terminal)
      AND a.status = 'Pending' AND a.next_attempt_at <= %(as_of)s
    ORDER BY a.next_attempt_at
    LIMIT %(batch_size)s
    FOR UPDATE OF a SKIP LOCKED
),
due AS (
    SELECT * FROM due_all
    UNION ALL
    SELECT * FROM due_terminal
),
classified AS (
    -- the phase decision is safetynet.finalize_classify (migration 0004), shared with plan
    SELECT d.id, d.attempts AS old_attempts, d.next_attempt_at AS old_next_attempt_at,
           c.found_recording_id, c.recording_status, c.tenant_id, c.session_ended_at,
           c.phase, c.poison_reason
    FROM due d
    CROSS JOIN LATERAL safetynet.finalize_classify(
        d.recording_id, %(as_of)s, %(sla)s, %(recheck)s) c
),
claimed AS (
    UPDATE messenger.recording_finalize_attempts a
    SET attempts = CASE WHEN c.phase = 'wait' THEN a.attempts ELSE a.attempts + 1 END,
        next_attempt_at = CASE
            WHEN c.phase = 'wait' AND c.session_ended_at IS NOT NULL
                THEN c.session_ended_at + %(sla)s * interval '1 second'
            WHEN c.phase = 'wait'
                THEN %(as_of)s + %(recheck)s * interval '1 second'
            -- base * factor^attempts in log space, the exponent capped at ln(cap / base):
            -- power() overflows float8 (and fails the claim) for large attempts/factors
            ELSE %(as_of)s + LEAST(%(backoff_cap)s,
                                   %(backoff_base)s * exp(LEAST(
                                       a.attempts * ln(%(backoff_factor)s::float8),
                                       ln(GREATEST(%(backoff_cap)s::float8
                                                   / %(backoff_base)s::float8, 1)))))
                             * (1 + %(backoff_jitter)s * (2 * random() - 1)) * interval '1 second'
        END,
        updated_at = now()
    FROM classified c
    -- the claimed ids as an array too: an index scan of the batch whatever the planner
    -- makes of the join (a hash join over the whole table below ~50k rows otherwise)
    WHERE a.id = c.id AND a.id = ANY(ARRAY(SELECT id FROM due))
    RETURNING a.id, a.recording_id, a.session_kind, a.session_id, a.attempts,
              a.next_attempt_at, c.old_attempts, c.old_next_attempt_at, c.phase,
              c.recording_status, c.tenant_id, c.poison_reason, c.session_ended_at
)
SELECT c.*, k.skipped_locked
FROM (SELECT GREATEST(0, (SELECT count(*) FROM candidates) - (SELECT count(*) FROM due))
          AS skipped_locked) k
LEFT JOIN claimed c ON true
ORDER BY c.old_next_attempt_at, c.id;

-- name: finalize_attempts_unclaim --
-- A configuration fault is not an attempt: give the row back as it was (attempts), due at
-- old_next_attempt_at: when it was due before the claim, or after its hold-off for a
-- withheld verdict or an unusable Content-Type (actors/finalize/holdoff.py).
UPDATE messenger.recording_finalize_attempts
SET attempts = %(old_attempts)s, next_attempt_at = %(old_next_attempt_at)s, updated_at = now()
WHERE id = %(id)s AND status = 'Pending';

-- name: finalize_attempts_unclaim_many --
-- The same for a group in one statement (rows withheld for want of evidence, deferred by
-- the breaker, or met by a configuration fault): parallel arrays, one entry per row; the
-- third holds when each row is due again.
UPDATE messenger.recording_finalize_attempts a
SET attempts = i.old_attempts, next_attempt_at = i.old_next_attempt_at, updated_at = now()
FROM unnest(%(ids)s::uuid[], %(old_attempts)s::int[], %(old_next_attempt_at)s::timestamptz[])
    AS i(id, old_attempts, old_next_attempt_at)
WHERE a.id = i.id AND a.status = 'Pending';

-- name: finalize_attempts_record_transient --
-- A transient failure keeps the row Pending (next_attempt_at was moved at claim), or
-- quarantines it once it has used max_attempts.
UPDATE messenger.recording_finalize_attempts
SET status = CASE WHEN attempts >= %(max_attempts)s THEN 'Quarantined' ELSE 'Pending' END,
    last_error = %(last_error)s,
    updated_at = now()
WHERE id = %(id)s AND status = 'Pending'
RETURNING status;

-- name: finalize_attempts_quarantine --
UPDATE messenger.recording_finalize_attempts
SET status = 'Quarantined', last_error = %(last_error)s, updated_at = now()
WHERE id = %(id)s AND status = 'Pending'
RETURNING status;

-- name: finalize_attempts_fail_timeout --
-- Missing binary after the SLA, for one row or a group, in one statement (one
-- transaction: the group commits or rolls back whole): -> Failed/Timeout (guarded),
-- realtime RecordingFailed, finalize row -> Done. No Kafka event: the contract has none
-- for failures. Inputs are parallel arrays, one entry per row.
-- A recording another transaction holds (the ingest callback) is skipped, not waited on:
-- the finalize row gets its attempt back and is due again from now (the next cycle).
-- Returns, per row, what happened to it.
-- Every row is reached by its key: the group's recordings are locked and looked up as
-- `id = ANY(ARRAY(...))`, an index probe per row whatever the statistics say; written
-- `id IN (SELECT ...)` the planner hashed the group and read call_recordings whole, twice
-- per statement (every recording ever made; docs/benchmarks.md). The status guards are
-- written `status || ''` so that they stay guards: as plain comparisons they let the
-- planner pick a partial index on status (ix_recording_active, ix_rfa_pending_created)
-- when statistics from a quiet time say it is nearly empty, and read a whole backlog per
-- statement (docs/benchmarks.md).
WITH input AS (
    SELECT * FROM unnest(%(attempt_ids)s::uuid[], %(recording_ids)s::uuid[],
                         %(old_attempts)s::int[])
        AS i(attempt_id, recording_id, old_attempts)
),
locked AS (
    SELECT r.id FROM messenger.call_recordings r
    WHERE r.id = ANY(ARRAY(SELECT recording_id FROM input))  -- by key (see above)
    ORDER BY r.id
    FOR NO KEY UPDATE SKIP LOCKED
),
busy AS (
    SELECT r.id FROM messenger.call_recordings r
    WHERE r.id = ANY(ARRAY(SELECT recording_id FROM input))
      AND r.id NOT IN (SELECT id FROM locked)
),
upd AS (
    UPDATE messenger.call_recordings
    SET status = 'Failed', failure_reason = 'Timeout', updated_at = now()
    WHERE id IN (SELECT id FROM locked) AND status || '' IN ('Pending', 'Recording', 'Uploading')
    RETURNING id, chat_id, session_kind, session_id  -- never *: only the contract's columns
),
rt AS (
    INSERT INTO messenger.realtime_outbox
        (kind, target_kind, chat_id, session_kind, reference_id, payload)
    SELECT 'RecordingFailed',
           CASE WHEN u.chat_id IS NULL THEN 'Session' ELSE 'ChatGroup' END,
           u.chat_id, u.session_kind, u.id,
           jsonb_build_object('RecordingId', u.id, 'SessionId', u.session_id,
                              'SessionKind', u.session_kind, 'Status', 'Failed',
                              'FailureReason', 'Timeout')
    FROM upd u
    ORDER BY u.id
    RETURNING reference_id
),
fin AS (
    UPDATE messenger.recording_finalize_attempts a
    SET status = 'Done', last_error = NULL, updated_at = now()
    FROM input i
    WHERE a.id = i.attempt_id AND a.status || '' = 'Pending'
      AND i.recording_id NOT IN (SELECT id FROM busy)
    RETURNING a.id
),
back AS (
    UPDATE messenger.recording_finalize_attempts a
    SET attempts = i.old_attempts, next_attempt_at = now(), updated_at = now()
    FROM input i
    WHERE a.id = i.attempt_id AND a.status || '' = 'Pending'
      AND i.recording_id IN (SELECT id FROM busy)
    RETURNING a.id
)
SELECT i.attempt_id,
       i.recording_id IN (SELECT id FROM upd) AS transitioned,
       i.recording_id IN (SELECT reference_id FROM rt) AS enqueued,
       i.attempt_id IN (SELECT id FROM fin) AS closed,
       i.attempt_id IN (SELECT id FROM back) AS skipped_locked
FROM input i;

-- name: finalize_attempts_requeue --
-- Runbook re-enqueue: Pending, attempts 0, due now.
UPDATE messenger.recording_finalize_attempts
SET status = 'Pending', attempts = 0, next_attempt_at = now(), last_error = NULL,
    updated_at = now()
WHERE id = ANY(%(ids)s)
RETURNING id, status;

-- name: finalize_attempts_stats --
-- The backlog gauges, bounded whatever the backlog (a count of a million-row backlog is a
-- scan of it; docs/benchmarks.md):
--   backlog:     Pending rows, exact up to 10,000 (index-only on ix_rfa_due); beyond, the
--                planner statistics' estimate (pg_class.reltuples x the share of
--                'Pending' in pg_stats, as fresh as the last ANALYZE), at least 10,000;
--   due:         Pending rows due now, exact up to 10,000, else 10,000 (read: >= 10,000);
--   quarantined: likewise capped at 10,000;
--   oldest_age_seconds: exact, from ix_rfa_pending_created (migration 0009).
WITH pending AS (
    SELECT count(*) AS n
    FROM (SELECT 1 FROM messenger.recording_finalize_attempts
          WHERE status = 'Pending'
          ORDER BY next_attempt_at  -- ix_rfa_due, index-only
          LIMIT 10000) p
),
estimate AS (
    SELECT c.reltuples * COALESCE((
        SELECT m.freq
        FROM pg_stats s
        CROSS JOIN LATERAL unnest(s.most_common_vals::text::text[], s.most_common_freqs)
            AS m(val, freq)
        WHERE s.schemaname = 'messenger' AND s.tablename = 'recording_finalize_attempts'
          AND s.attname = 'status' AND m.val = 'Pending'), 0) AS n
    FROM pg_class c
    WHERE c.oid = 'messenger.recording_finalize_attempts'::regclass
)
SELECT CASE WHEN p.n < 10000 THEN p.n
            ELSE GREATEST(p.n, (SELECT round(n) FROM estimate))::bigint END AS backlog,
       (SELECT count(*) FROM (SELECT 1 FROM messenger.recording_finalize_attempts
                              WHERE status = 'Pending' AND next_attempt_at <= now()
                              ORDER BY next_attempt_at LIMIT 10000) d) AS due,
       (SELECT count(*) FROM (SELECT 1 FROM messenger.recording_finalize_attempts
                              WHERE status = 'Quarantined'
                              ORDER BY next_attempt_at LIMIT 10000) q) AS quarantined,
       COALESCE(EXTRACT(EPOCH FROM now() - (
           SELECT min(created_at) FROM messenger.recording_finalize_attempts
           WHERE status = 'Pending')), 0) AS oldest_age_seconds
FROM pending p;

-- name: finalize_attempts_lookup --
-- Runbook: finalize rows named by their own id or by their recording's id.
SELECT id, recording_id, status, attempts, last_error
FROM messenger.recording_finalize_attempts
WHERE id = ANY(%(ids)s::uuid[]) OR recording_id = ANY(%(ids)s::uuid[])
FOR UPDATE;

-- name: finalize_attempts_quarantined_list --
-- `safetynet status` and the console overview: the oldest quarantined rows, through
-- ix_rfa_quarantined (without it, every quarantined row was read and sorted: 0.1 s at
-- 140,000).
SELECT id, recording_id, attempts, last_error, updated_at
FROM messenger.recording_finalize_attempts
WHERE status = 'Quarantined'
ORDER BY updated_at
LIMIT %(limit)s;

-- name: finalize_attempts_quarantined_ids --
SELECT id, recording_id, status, attempts, last_error
FROM messenger.recording_finalize_attempts
WHERE status = 'Quarantined'
FOR UPDATE;

-- name: finalize_attempts_publish_available --
-- The whole outcome of rows whose recording is (or becomes) Available, for one row or a
-- group, in one statement — one transaction: the group commits or rolls back whole and
-- every row in it is whole either way. The input is one JSON array, an object per row
-- (one parameter: no per-element array dumping in the daemon).
--   upd: where transition is set, Pending/Recording/Uploading -> Available adopting the
--        object's metadata (the status guard makes a second transition a no-op);
--   src: each recording as it now is, if Available (just now, or already), read by its
--        key: joined instead, a planner whose statistics predate a drain's new terminal
--        recordings walked ix_recording_terminal_updated, every terminal recording per
--        statement (0.3 s at 170,000, growing until autoanalyze; docs/benchmarks.md);
--   ob:  its call-recording-available outbox row, unless one exists (idempotent by
--        RecordingId through ux_outbox_dedupe);
--   rt:  realtime RecordingAvailable, only for rows whose event this statement enqueued;
--   fin: the finalize rows -> Done.
-- A recording another transaction holds (the ingest callback) is skipped, not waited on
-- (locked: FOR NO KEY UPDATE SKIP LOCKED, the lock the transition needs): nothing is
-- written for it, and its finalize row gets its attempt back, due again from now (back).
-- Returns, per row, what happened to it. Every row is reached by its key; the status
-- guards are written `status || ''` for the reason given at finalize_attempts_fail_timeout,
-- and the group's recordings are named as an array (`id = ANY(ARRAY(...))`) for the
-- reason given there.
WITH input AS (
    SELECT * FROM jsonb_to_recordset(%(rows)s::jsonb)
        AS i(attempt_id uuid, recording_id uuid, transition boolean, file_id text,
             size_bytes bigint, duration_seconds int, format text, headers jsonb,
             old_attempts int)
),
locked AS (
    SELECT r.id FROM messenger.call_recordings r
    WHERE r.id = ANY(ARRAY(SELECT recording_id FROM input))  -- by key (see above)
    ORDER BY r.id
    FOR NO KEY UPDATE SKIP LOCKED
),
busy AS (
    SELECT r.id FROM messenger.call_recordings r
    WHERE r.id = ANY(ARRAY(SELECT recording_id FROM input))
      AND r.id NOT IN (SELECT id FROM locked)
),
upd AS (
    UPDATE messenger.call_recordings r
    SET status = 'Available', file_id = i.file_id, size_bytes = i.size_bytes,
        duration_seconds = i.duration_seconds, format = i.format,
        available_at = now(), updated_at = now()
    FROM input i
    WHERE r.id = i.recording_id AND i.transition AND r.id IN (SELECT id FROM locked)
      AND r.status || '' IN ('Pending', 'Recording', 'Uploading')
    -- the columns named, never r.*: the runtime role may read only the contract's
    RETURNING r.id, r.session_id, r.session_kind, r.chat_id, r.deal_id, r.tenant_id,
              r.media_type, r.file_id, r.format, r.duration_seconds, r.size_bytes,
              r.trigger, r.started_at, r.ended_at, r.available_at, r.status
),
src AS (
    SELECT * FROM upd
    UNION ALL
    SELECT r.* FROM input i
    CROSS JOIN LATERAL (
        SELECT c.id, c.session_id, c.session_kind, c.chat_id, c.deal_id, c.tenant_id,
               c.media_type, c.file_id, c.format, c.duration_seconds, c.size_bytes,
               c.trigger, c.started_at, c.ended_at, c.available_at, c.status
        FROM messenger.call_recordings c WHERE c.id = i.recording_id
        LIMIT 1  -- a key probe per input row, whatever the statistics say (see below)
    ) r
    WHERE r.status = 'Available' AND r.id IN (SELECT id FROM locked)
      AND r.id NOT IN (SELECT id FROM upd)
),
ob AS (
    INSERT INTO messenger.integration_outbox
        (topic, message_key, dedupe_key, event_type, payload, headers)
    SELECT %(topic)s, s.session_id::text, s.id::text, 'CallRecordingAvailable',
           jsonb_build_object(
               'RecordingId', s.id, 'SessionKind', s.session_kind, 'SessionId', s.session_id,
               'ChatId', s.chat_id, 'DealId', s.deal_id, 'TenantId', s.tenant_id,
               'MediaType', s.media_type, 'FileId', s.file_id, 'Format', s.format,
               'DurationSeconds', s.duration_seconds, 'SizeBytes', s.size_bytes,
               'Trigger', s.trigger,
               'StartedAt', to_char(s.started_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
               'EndedAt', to_char(s.ended_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
               'AvailableAt', to_char(s.available_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')),
           i.headers
    FROM src s JOIN input i ON i.recording_id = s.id
    ORDER BY s.id
    ON CONFLICT (topic, dedupe_key) DO NOTHING
    RETURNING dedupe_key
),
rt AS (
    INSERT INTO messenger.realtime_outbox
        (kind, target_kind, chat_id, session_kind, reference_id, payload)
    SELECT 'RecordingAvailable',
           CASE WHEN s.chat_id IS NULL THEN 'Session' ELSE 'ChatGroup' END,
           s.chat_id, s.session_kind, s.id,
           jsonb_build_object('RecordingId', s.id, 'SessionId', s.session_id,
                              'SessionKind', s.session_kind, 'Status', 'Available')
    FROM src s
    WHERE s.id::text IN (SELECT dedupe_key FROM ob)
    RETURNING reference_id  -- not id: the runtime role may read only the contract's columns
),
fin AS (
    UPDATE messenger.recording_finalize_attempts a
    SET status = 'Done', last_error = NULL, updated_at = now()
    FROM input i
    WHERE a.id = i.attempt_id AND a.status || '' = 'Pending'
      AND i.recording_id NOT IN (SELECT id FROM busy)
    RETURNING a.id
),
back AS (
    UPDATE messenger.recording_finalize_attempts a
    SET attempts = i.old_attempts, next_attempt_at = now(), updated_at = now()
    FROM input i
    WHERE a.id = i.attempt_id AND a.status || '' = 'Pending'
      AND i.recording_id IN (SELECT id FROM busy)
    RETURNING a.id
)
SELECT i.attempt_id,
       i.recording_id IN (SELECT id FROM upd) AS transitioned,
       i.recording_id::text IN (SELECT dedupe_key FROM ob) AS enqueued,
       i.attempt_id IN (SELECT id FROM fin) AS closed,
       i.attempt_id IN (SELECT id FROM back) AS skipped_locked
FROM input i;

-- name: finalize_attempts_known_present --
-- The positive canary's candidates: recordings whose binary is known to exist — Available
-- with a file_id — among the newest finalize rows already Done (ix_rfa_due read
-- backwards: the cost does not grow with call_recordings).
SELECT r.id
FROM messenger.recording_finalize_attempts a
JOIN messenger.call_recordings r ON r.id = a.recording_id
WHERE a.status = 'Done' AND r.status = 'Available' AND r.file_id IS NOT NULL
ORDER BY a.next_attempt_at DESC
LIMIT %(limit)s;
