-- name: outbox_frozen_keys --
-- Every key held back (issue #38 item 2): behind a dead letter that blocks it, or behind
-- a row in retry (unpublished, a last_error from a transient failure, not a dead letter)
-- that later rows of its key wait for. Per key its first blocker (the row holding it now),
-- since when, the blocker's error and attempts, and how many unpublished rows wait behind
-- it. Bounded however long the backlog: the unpublished rows read are the first
-- %(scan)s in id order (ix_outbox_unpublished), the blocking dead letters at most %(scan)s
-- (ix_dead_letters_blocking), so `waiting` is a count among those (capped, like the outbox
-- page's). Keys compare on the dead letters' prefixes (249 and 400 characters), as the
-- claim does.
WITH waiting AS MATERIALIZED (
    SELECT o.id, left(o.topic, 249) AS topic, left(o.message_key, 400) AS message_key,
           o.last_error, o.created_at, o.publish_attempts
    FROM messenger.integration_outbox o
    WHERE o.published_at IS NULL
      AND NOT EXISTS (SELECT 1 FROM safetynet.outbox_dead_letters d WHERE d.outbox_id = o.id)
    ORDER BY o.id
    LIMIT %(scan)s
),
retrying AS (
    SELECT w.*, lead(w.id) OVER (PARTITION BY w.topic, w.message_key ORDER BY w.id) AS next_id
    FROM waiting w
),
blockers AS (
    SELECT d.outbox_id AS blocker_id, d.topic, d.message_key, d.created_at AS since,
           d.reason AS error, 'dead letter' AS kind, NULL::integer AS attempts
    FROM (SELECT * FROM safetynet.outbox_dead_letters WHERE blocks_key
          ORDER BY topic, message_key, outbox_id LIMIT %(scan)s) d
    UNION ALL
    SELECT r.id, r.topic, r.message_key, r.created_at, r.last_error, 'retry', r.publish_attempts
    FROM retrying r
    WHERE r.last_error IS NOT NULL AND r.next_id IS NOT NULL
),
first AS (
    SELECT DISTINCT ON (b.topic, b.message_key) b.*
    FROM blockers b
    ORDER BY b.topic, b.message_key, b.blocker_id
),
shown AS (
    SELECT f.*, count(*) OVER () AS total
    FROM first f
    ORDER BY f.since, f.blocker_id
    LIMIT %(limit)s
)
SELECT s.topic, s.message_key, s.since, s.blocker_id, s.kind, s.error, s.attempts, s.total,
       (SELECT count(*) FROM waiting w
        WHERE w.topic = s.topic AND w.message_key = s.message_key AND w.id > s.blocker_id
       ) AS waiting
FROM shown s
ORDER BY s.since, s.blocker_id;

-- name: outbox_set_aside --
-- An operator sets aside rows in retry that hold back their key (issue #38 item 2): each
-- of %(ids)s still as the page showed it (unpublished, failing: last_error set, not a
-- dead letter) is locked and dead-lettered without blocking its key (blocks_key false:
-- the later rows of the key go on without it; `safetynet replay` puts it back), its
-- last_error marked 'dead-letter: ' as the relay's dead letters are. A row published or
-- dead-lettered meanwhile is left alone. The ids set aside.
WITH still AS (
    SELECT o.id, o.topic, o.message_key, o.last_error
    FROM messenger.integration_outbox o
    WHERE o.id = ANY(%(ids)s::bigint[]) AND o.published_at IS NULL
      AND o.last_error IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM safetynet.outbox_dead_letters d WHERE d.outbox_id = o.id)
    FOR UPDATE OF o
),
dead AS (
    INSERT INTO safetynet.outbox_dead_letters (outbox_id, topic, message_key, reason, blocks_key)
    SELECT s.id, left(s.topic, 249), left(s.message_key, 400),
           left('set aside: ' || s.last_error, 512), false
    FROM still s
    ON CONFLICT (outbox_id) DO NOTHING
    RETURNING outbox_id
)
UPDATE messenger.integration_outbox o
SET last_error = left('dead-letter: set aside: ' || o.last_error, 512)
FROM dead
WHERE o.id = dead.outbox_id
RETURNING o.id;
