-- The invariant auditor (`safetynet audit`, the auditor actor). Read-only. Each query
-- returns the facts of suspect rows only, at most %(limit)s, and reads a bounded window
-- through an index (migration 0008, docs/operations.md "Invariant auditor" shows the
-- plans): %(window)s seconds back, never beyond %(retention)s (outbox retention: a pruned
-- outbox row is not a violation), and never a transition younger than %(grace)s.
-- actors/audit/invariants.py turns the facts into violations.

-- name: audit_read_only --
-- `safetynet audit`'s own session: every transaction read-only.
SET default_transaction_read_only = on;

-- name: audit_read_only_transaction --
-- The auditor actor's run (a pooled connection, one transaction): read-only.
SET LOCAL transaction_read_only = on;

-- name: audit_recordings_terminal --
-- Recordings that became Available/Failed in the window (ix_recording_terminal_updated)
-- with a missing event, a missing or doubled realtime row, or attempts past the bound.
SELECT r.id::text AS id, r.status, a.status AS finalize_status, a.attempts,
       o.has_outbox, t.own_realtime, t.realtime_rows
FROM messenger.call_recordings r
LEFT JOIN LATERAL (  -- lateral: one ux_rfa_recording probe per row, never a hash of all
    SELECT f.id, f.status, f.attempts FROM messenger.recording_finalize_attempts f
    WHERE f.recording_id = r.id LIMIT 1  -- unique anyway; keeps the planner from a hash
) a ON true
CROSS JOIN LATERAL (
    SELECT EXISTS (SELECT 1 FROM messenger.integration_outbox x
                   WHERE x.topic = %(rec_topic)s AND x.dedupe_key = r.id::text) AS has_outbox
) o
CROSS JOIN LATERAL (
    SELECT count(*) FILTER (WHERE x.kind = 'Recording' || r.status) AS own_realtime,
           count(*) AS realtime_rows
    FROM messenger.realtime_outbox x
    WHERE x.reference_id = r.id
      AND x.kind IN ('RecordingAvailable', 'RecordingFailed', 'ConferenceEnded',
                     'ConferenceSignal')
) t
WHERE r.status IN ('Available', 'Failed')
  AND r.updated_at >= now() - least(%(window)s, %(retention)s) * interval '1 second'
  AND r.updated_at < now() - %(grace)s * interval '1 second'
  AND ((r.status = 'Available' AND a.id IS NOT NULL AND NOT o.has_outbox)
       OR (a.status = 'Done' AND t.own_realtime = 0)
       OR t.realtime_rows > 1
       OR a.attempts > %(max_attempts)s)
ORDER BY r.updated_at
LIMIT %(limit)s;

-- name: audit_conferences_terminal --
-- Conferences that became Ended/Failed in the window (ix_conf_terminal_updated) without
-- their event (reaper outcomes) or realtime row, or with more than one realtime row.
SELECT c.id::text AS id, c.status, c.end_reason, o.has_outbox, t.realtime_rows,
       t.terminal_rows
FROM messenger.conference_sessions c
CROSS JOIN LATERAL (
    SELECT EXISTS (SELECT 1 FROM messenger.integration_outbox x
                   WHERE x.topic = %(conf_topic)s AND x.dedupe_key = c.id::text) AS has_outbox
) o
CROSS JOIN LATERAL (
    SELECT count(*) FILTER (WHERE x.session_kind = 'Conference') AS realtime_rows,
           count(*) FILTER (WHERE x.kind IN ('RecordingAvailable', 'RecordingFailed',
                                             'ConferenceEnded', 'ConferenceSignal'))
               AS terminal_rows
    FROM messenger.realtime_outbox x WHERE x.reference_id = c.id
) t
WHERE c.status IN ('Ended', 'Failed')
  AND c.updated_at >= now() - least(%(window)s, %(retention)s) * interval '1 second'
  AND c.updated_at < now() - %(grace)s * interval '1 second'
  AND ((c.status = 'Ended' AND c.end_reason IN ('EmptyTimeout', 'Timeout')
        AND NOT o.has_outbox)
       OR (c.end_reason IN ('EmptyTimeout', 'Timeout', 'Error') AND t.realtime_rows = 0)
       OR t.terminal_rows > 1)
ORDER BY c.updated_at
LIMIT %(limit)s;

-- name: audit_outbox_recent --
-- Outbox rows of safetynet's topics written in the window (ix_outbox_created) whose
-- subject is not in the state the event announces, or that share their dedupe key
-- (ux_outbox_dedupe) with another row.
SELECT o.id, o.topic, o.dedupe_key, s.status AS subject_status, d.same_key AS same_key
FROM messenger.integration_outbox o
CROSS JOIN LATERAL (
    SELECT CASE WHEN o.dedupe_key ~ '^[0-9a-fA-F-]{36}$' THEN o.dedupe_key::uuid END AS sid
) k
LEFT JOIN LATERAL (
    SELECT r.status FROM messenger.call_recordings r
    WHERE o.topic = %(rec_topic)s AND r.id = k.sid
    UNION ALL
    SELECT c.status FROM messenger.conference_sessions c
    WHERE o.topic = %(conf_topic)s AND c.id = k.sid
) s ON true
CROSS JOIN LATERAL (
    SELECT count(*) AS same_key FROM messenger.integration_outbox x
    WHERE x.topic = o.topic AND x.dedupe_key = o.dedupe_key
) d
WHERE o.topic IN (%(rec_topic)s, %(conf_topic)s)
  AND o.created_at >= now() - %(window)s * interval '1 second'
  AND (s.status IS DISTINCT FROM CASE WHEN o.topic = %(rec_topic)s THEN 'Available'
                                      ELSE 'Ended' END
       OR d.same_key > 1)
ORDER BY o.id
LIMIT %(limit)s;

-- name: audit_outbox_unpublished --
-- Outbox rows still unpublished past the relay lag (ix_outbox_unpublished). In the
-- relay's logical source (safetynet.outbox_relay_source; published_at is never set):
-- among the newest 10,000 unpublished rows, those the slot has not passed as the relay
-- last recorded it (dead letters and held rows are the dead letters' invariants).
WITH r AS (
    SELECT s.source = 'logical' AS logical,
           mod(s.passed_xid, 4294967296)::text::xid AS passed
    FROM (SELECT NULL) x
    LEFT JOIN safetynet.outbox_relay_source s ON s.id
)
SELECT u.id, u.topic, u.dedupe_key,
       floor(extract(epoch FROM now() - u.created_at))::bigint AS age_seconds
FROM ((SELECT o.id, o.topic, o.dedupe_key, o.created_at
       FROM messenger.integration_outbox o
       WHERE NOT COALESCE((SELECT logical FROM r), false)
         AND o.published_at IS NULL
         AND o.created_at < now() - %(relay_lag)s * interval '1 second'
       ORDER BY o.id
       LIMIT %(limit)s)  -- its own limit: ix_outbox_unpublished read in order, no more
      UNION ALL
      SELECT n.id, n.topic, n.dedupe_key, n.created_at
      FROM (SELECT o.id, o.topic, o.dedupe_key, o.created_at, o.last_error,
                   age(o.xmin) AS xmin_age
            FROM messenger.integration_outbox o
            WHERE COALESCE((SELECT logical FROM r), false) AND o.published_at IS NULL
            ORDER BY o.id DESC
            LIMIT 10000) n
      WHERE n.created_at < now() - %(relay_lag)s * interval '1 second'
        AND (n.last_error IS NULL OR NOT (n.last_error ^@ 'dead-letter:'
                                          OR n.last_error ^@ 'held:'))
        AND NOT COALESCE(n.xmin_age > age((SELECT passed FROM r)), false)) u
ORDER BY u.id
LIMIT %(limit)s;

-- name: audit_recordings_active --
-- Non-terminal recordings (ix_recording_active) whose session ended more than the SLA
-- (+ slack) ago and whose finalize row is not quarantined: past the SLO.
-- Lateral joins: primary-key probes per active row, never a hash of a whole table.
-- Walked in the index's own order, so the walk stops at the %(limit)s-th violation: after
-- an outage a million recordings past the SLO cost %(limit)s rows' probes. (Ordered by id,
-- every active recording was probed and sorted: 12 s of a core at a million, every
-- audit.interval; docs/benchmarks.md.) Beyond the violations it reads only recordings
-- not yet past the SLO: live and recently ended calls, traffic rather than backlog.
SELECT r.id::text AS id, r.status, coalesce(a.status, 'none') AS finalize_status,
       floor(extract(epoch FROM now() - e.ended_at))::bigint AS ended_seconds_ago
FROM messenger.call_recordings r
LEFT JOIN LATERAL (
    SELECT f.status FROM messenger.recording_finalize_attempts f WHERE f.recording_id = r.id
    LIMIT 1  -- unique anyway; keeps the planner from a hash of the whole table
) a ON true
CROSS JOIN LATERAL (
    SELECT max(x.ended_at) AS ended_at
    FROM (SELECT cs.ended_at FROM messenger.call_sessions cs
          WHERE r.session_kind = 'Direct' AND cs.id = r.session_id
          UNION ALL
          SELECT cf.ended_at FROM messenger.conference_sessions cf
          WHERE r.session_kind = 'Conference' AND cf.id = r.session_id) x
) e
WHERE r.status IN ('Pending', 'Recording', 'Uploading')
  AND coalesce(a.status, '') <> 'Quarantined'
  AND e.ended_at < now() - (%(sla)s + %(slack)s) * interval '1 second'
ORDER BY r.session_kind, r.session_id
LIMIT %(limit)s;

-- name: audit_conferences_active --
-- Provisioning/Active conferences due for a reaper phase more than slack ago: past the
-- reaper's window. One branch per phase, each walking the index its claim walks, oldest
-- first (ix_conf_provisioning, ix_conf_empty_room, ix_conf_active), and stopping at
-- %(limit)s rows: the read is bounded by the limit, not by the live rooms (one scan of
-- every Active room before). A room in two phases' windows is listed once.
SELECT due.id::text AS id, due.status
FROM (
    (SELECT c.id, c.status FROM messenger.conference_sessions c
     WHERE c.status = 'Provisioning'
       AND c.created_at < now() - (%(provision_timeout)s + %(slack)s) * interval '1 second'
     ORDER BY c.created_at, c.id
     LIMIT %(limit)s)
    UNION
    (SELECT c.id, c.status FROM messenger.conference_sessions c
     WHERE c.status = 'Active' AND c.active_participant_count = 0
       AND c.last_activity_at
           < now() - (%(empty_room_grace)s + %(slack)s) * interval '1 second'
     ORDER BY c.last_activity_at, c.id
     LIMIT %(limit)s)
    UNION
    (SELECT c.id, c.status FROM messenger.conference_sessions c
     WHERE c.status = 'Active'
       AND c.last_activity_at
           < now() - (%(stale_live_timeout)s + %(slack)s) * interval '1 second'
     ORDER BY c.last_activity_at
     LIMIT %(limit)s)
) due
ORDER BY due.id
LIMIT %(limit)s;

-- name: audit_finalize_attempts_open --
-- Pending and Quarantined finalize rows (ix_rfa_due) with attempts past max_attempts, a
-- Pending row that used every attempt and was not quarantined within a cycle, or an s3
-- quarantine before the last attempt.
SELECT recording_id::text AS id, status, attempts, coalesce(last_error, '') AS last_error,
       updated_at < now() - %(cycle)s * interval '1 second' AS settled
FROM messenger.recording_finalize_attempts
WHERE status IN ('Pending', 'Quarantined')
  AND (attempts > %(max_attempts)s
       OR (status = 'Pending' AND attempts >= %(max_attempts)s
           AND updated_at < now() - %(cycle)s * interval '1 second')
       OR (status = 'Quarantined' AND last_error LIKE 's3:%%'
           AND attempts <> %(max_attempts)s))
ORDER BY recording_id
LIMIT %(limit)s;

-- name: audit_recordings_failed_sample --
-- The most recent Failed recordings in the window (ix_recording_terminal_updated): the
-- sample `safetynet audit` HEADs for failed_with_object.
SELECT id::text AS id FROM messenger.call_recordings
WHERE status = 'Failed'
  AND updated_at >= now() - %(window)s * interval '1 second'
  AND updated_at < now() - %(grace)s * interval '1 second'
ORDER BY updated_at DESC
LIMIT %(limit)s;

-- name: audit_outbox_by_subjects --
-- The outbox rows of the events read from Kafka (by topic + dedupe key, ux_outbox_dedupe)
-- plus every row published in the window: what the topic read is compared with.
-- In the relay's logical source (published_at is never set) a row is published once the
-- slot has passed it as the relay recorded it, and judged when it was created in the
-- window and recorded passed before the topic was read.
WITH r AS (
    SELECT mod(s.passed_xid, 4294967296)::text::xid AS passed, s.updated_at
    FROM safetynet.outbox_relay_source s WHERE s.id AND s.source = 'logical'
)
SELECT o.id, o.topic, o.message_key, o.dedupe_key, o.payload,
       o.published_at IS NOT NULL
           OR COALESCE(age(o.xmin) > age(r.passed), false) AS published,
       (o.published_at >= now() - %(judged)s * interval '1 second'
           AND o.published_at < %(read_at)s)
       OR COALESCE(age(o.xmin) > age(r.passed)
                   AND o.created_at >= now() - %(judged)s * interval '1 second'
                   AND r.updated_at < %(read_at)s, false) AS judged
FROM messenger.integration_outbox o
LEFT JOIN r ON true
WHERE o.topic IN (%(rec_topic)s, %(conf_topic)s)
  AND (o.dedupe_key = ANY(%(subjects)s)
       OR o.created_at >= now() - %(window)s * interval '1 second')
ORDER BY o.id;

-- name: audit_db_now --
SELECT now();
