-- The console's pages (issue #27): every statement bounded on big tables — keyset pages
-- through an index, counts capped at 10,000 (docs/console.md, bench/console_pages.py).

-- name: console_ping --
-- The bench's baseline: one trivial round trip.
SELECT 1;

-- name: console_finalize_page --
-- Recordings: one keyset page of finalize rows in %(status)s ordered by
-- (next_attempt_at, id) through ix_rfa_queue (status, next_attempt_at, id): the row
-- comparison is the index range's start, so a page reads its 51 rows however many rows
-- share one next_attempt_at (ix_rfa_due alone sorted every row of the window: 1.8 s at a
-- million, docs/benchmarks.md); %(window)s 'due' (due now), 'later' (rescheduled into the
-- future) or 'all'.
SELECT a.id, a.recording_id, a.session_kind, a.session_id, a.status, a.attempts,
       a.next_attempt_at, a.last_error, a.updated_at, r.status AS recording_status,
       r.file_id
FROM messenger.recording_finalize_attempts a
LEFT JOIN messenger.call_recordings r ON r.id = a.recording_id
WHERE a.status = %(status)s
  -- one start for the range: the cursor, or now() for 'later' before the cursor passes it
  -- (a second lower bound on next_attempt_at would not narrow the range's start)
  AND (a.next_attempt_at, a.id) > (
        CASE WHEN %(window)s = 'later' AND %(after_at)s::timestamptz < now() THEN now()
             ELSE %(after_at)s::timestamptz END,
        CASE WHEN %(window)s = 'later' AND %(after_at)s::timestamptz < now()
             THEN '00000000-0000-0000-0000-000000000000'::uuid
             ELSE %(after_id)s::uuid END)
  AND a.next_attempt_at <= CASE WHEN %(window)s = 'due' THEN now()
                                ELSE 'infinity'::timestamptz END
ORDER BY a.next_attempt_at, a.id
LIMIT %(limit)s;

-- name: console_finalize_search --
-- Recordings: the finalize rows of one id — a row's, a recording's, a session's (through
-- ix_recording_session) — or of a file id (ix_recording_file_id, migration 0012).
SELECT a.id, a.recording_id, a.session_kind, a.session_id, a.status, a.attempts,
       a.next_attempt_at, a.last_error, a.updated_at, r.status AS recording_status,
       r.file_id
FROM messenger.recording_finalize_attempts a
LEFT JOIN messenger.call_recordings r ON r.id = a.recording_id
WHERE a.id IN (
    SELECT x.id FROM messenger.recording_finalize_attempts x WHERE x.id = %(uuid)s::uuid
    UNION
    SELECT x.id FROM messenger.recording_finalize_attempts x
    WHERE x.recording_id = %(uuid)s::uuid
    UNION
    SELECT x.id FROM messenger.call_recordings c
    JOIN messenger.recording_finalize_attempts x ON x.recording_id = c.id
    WHERE c.session_id = %(uuid)s::uuid
      AND c.session_kind IN ('Direct', 'Conference')
    UNION
    SELECT x.id FROM messenger.call_recordings c
    JOIN messenger.recording_finalize_attempts x ON x.recording_id = c.id
    WHERE c.file_id = %(text)s)
ORDER BY a.next_attempt_at, a.id
LIMIT %(limit)s;

-- name: console_conference_phase_counts --
-- Conferences: the active backlog per phase (safetynet.conference_phase decides), each
-- index range read at most 10,000 rows deep (the count then reads ">= 10,000").
SELECT phase, count(*) AS n
FROM (SELECT * FROM (SELECT c.id, c.status, c.active_participant_count,
                            c.last_activity_at, c.created_at
                     FROM messenger.conference_sessions c
                     WHERE c.status = 'Active' AND c.active_participant_count = 0
                       AND c.last_activity_at <= now()
                           - %(empty_room_grace)s * interval '1 second'
                     LIMIT 10000) e
      UNION
      SELECT * FROM (SELECT c.id, c.status, c.active_participant_count,
                            c.last_activity_at, c.created_at
                     FROM messenger.conference_sessions c
                     WHERE c.status = 'Provisioning'
                       AND c.created_at <= now() - %(provision_timeout)s * interval '1 second'
                     LIMIT 10000) p
      UNION
      SELECT * FROM (SELECT c.id, c.status, c.active_participant_count,
                            c.last_activity_at, c.created_at
                     FROM messenger.conference_sessions c
                     WHERE c.status = 'Active'
                       AND c.last_activity_at <= now()
                           - %(stale_live_timeout)s * interval '1 second'
                     LIMIT 10000) s) d,
     LATERAL safetynet.conference_phase(
         d.status, d.active_participant_count, d.last_activity_at, d.created_at, now(),
         %(empty_room_grace)s, %(provision_timeout)s, %(stale_live_timeout)s) AS phase
WHERE phase IS NOT NULL
GROUP BY phase
ORDER BY phase;

-- name: console_outbox_stats --
-- Outbox: unpublished rows (capped at 10,000, through ix_outbox_unpublished), the oldest
-- one's age, blocked keys and dead letters (both capped).
SELECT (SELECT count(*) FROM (SELECT 1 FROM messenger.integration_outbox
                              WHERE published_at IS NULL ORDER BY id LIMIT 10000) u
       ) AS unpublished,
       COALESCE(EXTRACT(EPOCH FROM now() - (
           SELECT created_at FROM messenger.integration_outbox
           WHERE published_at IS NULL ORDER BY id LIMIT 1)), 0)::float8 AS oldest_age_seconds,
       (SELECT count(*) FROM (SELECT 1 FROM safetynet.outbox_dead_letters d
                              WHERE d.blocks_key LIMIT 10000) b) AS blocked_keys,
       (SELECT count(*) FROM (SELECT 1 FROM safetynet.outbox_dead_letters
                              LIMIT 10000) d) AS dead_lettered;

-- name: console_outbox_unpublished_page --
-- Outbox: one keyset page of unpublished rows in id order (the relay's order).
SELECT o.id, o.topic, o.message_key, o.event_type, o.created_at, o.publish_attempts,
       o.last_error, d.reason AS dead_reason
FROM messenger.integration_outbox o
LEFT JOIN safetynet.outbox_dead_letters d ON d.outbox_id = o.id
WHERE o.published_at IS NULL AND o.id > %(after)s
ORDER BY o.id
LIMIT %(limit)s;

-- name: console_dead_letters_page --
-- Outbox: one keyset page of dead letters, newest first, with the key each still blocks.
SELECT d.outbox_id, d.topic, d.message_key, d.reason, d.blocks_key, d.created_at
FROM safetynet.outbox_dead_letters d
WHERE d.outbox_id < %(before)s
ORDER BY d.outbox_id DESC
LIMIT %(limit)s;

-- name: console_outbox_get --
-- Outbox: one row and its dead letter, for the payload view: the payload's and headers'
-- first %(preview)s characters and their sizes, never the whole (a row another writer left
-- may hold 40 MB).
SELECT o.id, o.topic, o.message_key, o.dedupe_key, o.event_type,
       pg_catalog.left(o.payload::text, %(preview)s) AS payload_preview,
       pg_catalog.octet_length(o.payload::text) AS payload_bytes,
       pg_catalog.left(o.headers::text, %(preview)s) AS headers_preview,
       pg_catalog.octet_length(o.headers::text) AS headers_bytes,
       o.created_at, o.published_at, o.publish_attempts, o.last_error,
       d.reason AS dead_reason, d.blocks_key, d.created_at AS dead_at
FROM messenger.integration_outbox o
LEFT JOIN safetynet.outbox_dead_letters d ON d.outbox_id = o.id
WHERE o.id = %(id)s;

-- name: console_leases --
-- Overview: each job's last leader and whether it holds the lease now. A lease given back
-- at the end of a cycle has expires_at -infinity (leases.sql), which no client date type
-- holds: the state is told in words, the seconds left only while it is held.
SELECT job, holder, term, acquired_at,
       CASE WHEN expires_at > clock_timestamp() THEN 'holding'
            WHEN expires_at = '-infinity' THEN 'between cycles'
            ELSE 'expired' END AS state,
       CASE WHEN expires_at > clock_timestamp()
            THEN extract(epoch FROM expires_at - clock_timestamp())::float8 END AS seconds_left
FROM safetynet.leases
ORDER BY job;

-- name: console_outbox_unpublished_page_logical --
-- Outbox, logical source (published_at is never set): one keyset page, in id order, of
-- the rows among the newest 10,000 unpublished ones (backwards through
-- ix_outbox_unpublished) that the slot has not passed as the relay last recorded it
-- (safetynet.outbox_relay_source), the held ones and the dead letters.
WITH r AS (
    SELECT (SELECT mod(passed_xid, 4294967296)::text::xid FROM safetynet.outbox_relay_source
            WHERE id AND source = 'logical') AS passed
),
newest AS (
    SELECT o.id, o.topic, o.message_key, o.event_type, o.created_at, o.publish_attempts,
           o.last_error, age(o.xmin) AS xmin_age
    FROM messenger.integration_outbox o
    WHERE o.published_at IS NULL
    ORDER BY o.id DESC
    LIMIT 10000
)
SELECT n.id, n.topic, n.message_key, n.event_type, n.created_at, n.publish_attempts,
       n.last_error, d.reason AS dead_reason
FROM newest n CROSS JOIN r
LEFT JOIN safetynet.outbox_dead_letters d ON d.outbox_id = n.id
WHERE n.id > %(after)s
  AND (d.outbox_id IS NOT NULL OR n.last_error ^@ 'held:' OR n.last_error ^@ 'dead-letter:'
       OR NOT COALESCE(n.xmin_age > age(r.passed), false))
ORDER BY n.id
LIMIT %(limit)s;
