-- Incident-scoped actions (issue #38 item 3): the rows a filter matches, frozen at the
-- preview (supervision/app/incidents.py). Each statement walks one index over the time
-- range, reads at most %(examine)s rows of it (the CTE's LIMIT: a pattern that matches
-- nothing costs no more than that), filters them and returns at most %(limit)s ids in
-- index order, with how many rows it examined (examined = examine: the window holds
-- more, narrow the time range). %(since)s / %(until)s NULL: open ended; %(pattern)s NULL:
-- any error; else an ILIKE pattern (the caller escapes it).

-- name: incident_finalize_quarantined --
-- Quarantined finalize rows quarantined (updated_at) in [since, until), through
-- ix_rfa_quarantined (updated_at) WHERE status = 'Quarantined'.
WITH w AS MATERIALIZED (
    SELECT id, recording_id, updated_at, last_error
    FROM messenger.recording_finalize_attempts
    WHERE status = 'Quarantined'
      AND updated_at >= COALESCE(%(since)s::timestamptz, '-infinity')
      AND updated_at < COALESCE(%(until)s::timestamptz, 'infinity')
    ORDER BY updated_at
    LIMIT %(examine)s
)
SELECT w.id::text AS id, w.recording_id::text AS subject, w.updated_at AS at,
       left(w.last_error, 512) AS error, (SELECT count(*) FROM w) AS examined
FROM w
WHERE %(pattern)s::text IS NULL OR w.last_error ILIKE %(pattern)s::text
ORDER BY w.updated_at, w.id
LIMIT %(limit)s;

-- name: incident_finalize_pending --
-- Pending finalize rows due (next_attempt_at) in [since, until), through ix_rfa_queue
-- (status, next_attempt_at, id).
WITH w AS MATERIALIZED (
    SELECT id, recording_id, next_attempt_at, last_error
    FROM messenger.recording_finalize_attempts
    WHERE status = 'Pending'
      AND next_attempt_at >= COALESCE(%(since)s::timestamptz, '-infinity')
      AND next_attempt_at < COALESCE(%(until)s::timestamptz, 'infinity')
    ORDER BY next_attempt_at, id
    LIMIT %(examine)s
)
SELECT w.id::text AS id, w.recording_id::text AS subject, w.next_attempt_at AS at,
       left(w.last_error, 512) AS error, (SELECT count(*) FROM w) AS examined
FROM w
WHERE %(pattern)s::text IS NULL OR w.last_error ILIKE %(pattern)s::text
ORDER BY w.next_attempt_at, w.id
LIMIT %(limit)s;

-- name: incident_dead_letters --
-- Dead letters dead-lettered (created_at) in [since, until), of %(topic)s (NULL: any),
-- whose key starts with %(key_prefix)s (NULL: any), through ix_dead_letters_created
-- (created_at, outbox_id).
WITH w AS MATERIALIZED (
    SELECT outbox_id, topic, message_key, reason, created_at
    FROM safetynet.outbox_dead_letters
    WHERE created_at >= COALESCE(%(since)s::timestamptz, '-infinity')
      AND created_at < COALESCE(%(until)s::timestamptz, 'infinity')
    ORDER BY created_at, outbox_id
    LIMIT %(examine)s
)
SELECT w.outbox_id::text AS id, left(w.topic, 256) || '/' || left(w.message_key, 256)
           AS subject,
       w.created_at AS at, left(w.reason, 512) AS error,
       (SELECT count(*) FROM w) AS examined
FROM w
WHERE (%(topic)s::text IS NULL OR w.topic = %(topic)s::text)
  AND (%(key_prefix)s::text IS NULL OR starts_with(w.message_key, %(key_prefix)s::text))
  AND (%(pattern)s::text IS NULL OR w.reason ILIKE %(pattern)s::text)
ORDER BY w.created_at, w.outbox_id
LIMIT %(limit)s;

-- name: incident_poison --
-- Poison conferences (still Provisioning or Active) that first failed in [since, until):
-- the table holds one row per remembered poison conference (pruned every cycle), read in
-- its primary key's order and bounded like the others.
WITH w AS MATERIALIZED (
    SELECT p.conference_id, p.phase, p.reason, p.first_failed_at
    FROM safetynet.conference_poison p
    JOIN messenger.conference_sessions c
      ON c.id = p.conference_id AND c.status IN ('Provisioning', 'Active')
    WHERE p.first_failed_at >= COALESCE(%(since)s::timestamptz, '-infinity')
      AND p.first_failed_at < COALESCE(%(until)s::timestamptz, 'infinity')
    ORDER BY p.first_failed_at, p.conference_id
    LIMIT %(examine)s
)
SELECT w.conference_id::text AS id, w.phase AS subject, w.first_failed_at AS at,
       left(w.reason, 512) AS error, (SELECT count(*) FROM w) AS examined
FROM w
WHERE %(pattern)s::text IS NULL OR w.reason ILIKE %(pattern)s::text
ORDER BY w.first_failed_at, w.conference_id
LIMIT %(limit)s;
