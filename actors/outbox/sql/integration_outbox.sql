-- name: outbox_claim_batch --
-- The next unpublished rows in id order. Skips rows another relay holds, dead-lettered
-- rows, every row of a key blocked behind a dead letter of that key (per-key order is
-- never broken; a blocked key raises an alert instead), and the rows of topics held by
-- a configuration fault (so they never fill the batch and starve the other topics).
-- Dead letters are out of the path twice over: ix_outbox_live leaves out rows whose
-- last_error has the 'dead-letter:' prefix (migration 0011), and NOT EXISTS checks the
-- dead letters themselves (rows dead-lettered before 0011 may lack the prefix).
--
-- Sizes first (issue #26): a row's bytes (payload and headers as sent, plus its text
-- columns) are measured in the database; a row over %(max_row_bytes)s comes back without
-- its payload and headers (the relay dead-letters it unread), and the claim stops before
-- the row that would take the payloads fetched past %(max_bytes)s (the first row always
-- comes, so a claim makes progress). Rows cut by the byte cap are claimed by a later
-- claim (their locks end with this transaction). claimed_n is how many rows the claim
-- locked before the cap, so the relay knows a cut claim is not the end of the backlog.
-- The payload comes as text: it is sent as it is stored (jsonb's canonical JSON), with
-- no parse/serialise round trip in Python; its JSON type says whether it is an object.
-- The headers come as text too (decoded from a str by the relay: cheaper than psycopg's
-- jsonb loader).
-- Within a cycle the next claim runs while the rows of the previous ones are still being
-- sent or marked: behind a backlog it takes the rows after the last claimed id; caught up
-- (the last claim was short) it starts from the beginning again, so a row that committed
-- after rows with higher ids (concurrent writers) is not passed over, and skips the ids
-- this cycle claimed and has not marked yet.
WITH claimed AS (
    SELECT o.id,
           octet_length(o.payload::text) + octet_length(o.headers::text)
             + octet_length(o.topic) + octet_length(o.message_key)
             + octet_length(o.dedupe_key) + octet_length(o.event_type) AS size
    FROM messenger.integration_outbox o
    WHERE o.published_at IS NULL
      AND (o.last_error IS NULL OR NOT o.last_error ^@ 'dead-letter:')
      AND o.id > %(after_id)s
      AND o.id <> ALL(%(skip)s::bigint[])
      AND o.topic <> ALL(%(held_topics)s::text[])
      AND NOT EXISTS (SELECT 1 FROM safetynet.outbox_dead_letters d WHERE d.outbox_id = o.id)
      AND NOT EXISTS (SELECT 1 FROM safetynet.outbox_dead_letters d
                      WHERE d.blocks_key AND d.topic = left(o.topic, 249)
                        AND d.message_key = left(o.message_key, 400) AND d.outbox_id < o.id)
    ORDER BY o.id
    LIMIT %(batch_size)s
    FOR UPDATE OF o SKIP LOCKED
),
sized AS (
    SELECT c.id, c.size, c.size > %(max_row_bytes)s AS oversized,
           count(*) OVER () AS claimed_n,
           COALESCE(sum(CASE WHEN c.size > %(max_row_bytes)s THEN 0 ELSE c.size END)
                    OVER (ORDER BY c.id ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING),
                    0) AS bytes_before
    FROM claimed c
)
SELECT o.id,
       CASE WHEN s.oversized THEN left(o.topic, 256) ELSE o.topic END AS topic,
       CASE WHEN s.oversized THEN left(o.message_key, 256) ELSE o.message_key END
           AS message_key,
       CASE WHEN s.oversized THEN NULL ELSE o.dedupe_key END AS dedupe_key,
       CASE WHEN s.oversized THEN NULL ELSE o.event_type END AS event_type,
       CASE WHEN s.oversized THEN NULL ELSE o.payload::text END AS payload,
       jsonb_typeof(o.payload) AS payload_type,
       CASE WHEN s.oversized THEN NULL ELSE o.headers::text END AS headers,
       s.size, s.oversized, s.claimed_n
FROM sized s
JOIN messenger.integration_outbox o ON o.id = s.id
WHERE s.bytes_before < %(max_bytes)s
ORDER BY s.id;

-- name: outbox_has_publishable --
-- The relay's idle probe, before it takes its lease: is any row waiting that a claim
-- would take (the claim's filter, without the topics held in memory and without locks)?
SELECT EXISTS (
    SELECT 1 FROM messenger.integration_outbox o
    WHERE o.published_at IS NULL
      AND (o.last_error IS NULL OR NOT o.last_error ^@ 'dead-letter:')
      AND NOT EXISTS (SELECT 1 FROM safetynet.outbox_dead_letters d WHERE d.outbox_id = o.id)
      AND NOT EXISTS (SELECT 1 FROM safetynet.outbox_dead_letters d
                      WHERE d.blocks_key AND d.topic = left(o.topic, 249)
                        AND d.message_key = left(o.message_key, 400) AND d.outbox_id < o.id));

-- name: outbox_mark_published --
-- Only after the broker acknowledged each of these rows.
UPDATE messenger.integration_outbox
SET published_at = now(), publish_attempts = publish_attempts + 1, last_error = NULL
WHERE id = ANY(%(ids)s) AND published_at IS NULL
-- each row's commit-to-ack latency in ms (the charts' rollup, migration 0016)
RETURNING GREATEST(0, round(EXTRACT(EPOCH FROM clock_timestamp() - created_at) * 1000))::bigint;

-- name: outbox_mark_failed --
UPDATE messenger.integration_outbox
SET publish_attempts = publish_attempts + 1, last_error = %(last_error)s
WHERE id = ANY(%(ids)s) AND published_at IS NULL;

-- name: outbox_dead_letter --
-- A message the broker (or the client) rejects permanently, or a malformed row: never
-- retried, never published (until `safetynet replay`). It blocks its key only when later
-- rows of that key are already waiting. The row's last_error gets the 'dead-letter:'
-- prefix, which takes it out of ix_outbox_live (migration 0011). Its topic and key are
-- kept to 249 and 400 characters (a btree entry holds ~2.7 kB: a hostile 2 MB key could
-- not be dead-lettered at all, and every claim would fail on it); the queries compare
-- the same prefixes, so a longer key at worst holds back another key sharing them.
WITH dead AS (
    INSERT INTO safetynet.outbox_dead_letters (outbox_id, topic, message_key, reason, blocks_key)
    SELECT o.id, left(o.topic, 249), left(o.message_key, 400), %(reason)s,
           EXISTS (SELECT 1 FROM messenger.integration_outbox w
                   WHERE w.topic = o.topic AND w.message_key = o.message_key
                     AND w.id > o.id AND w.published_at IS NULL)
    FROM messenger.integration_outbox o
    WHERE o.id = %(id)s
    ON CONFLICT (outbox_id) DO NOTHING
    RETURNING blocks_key
),
marked AS (
    UPDATE messenger.integration_outbox SET publish_attempts = publish_attempts + 1,
        last_error = left('dead-letter: ' || %(reason)s, 512)
    WHERE id = %(id)s
)
SELECT blocks_key FROM dead;

-- name: outbox_delete_published_before --
-- Retention, in small batches so no long lock or huge WAL burst. The oldest published
-- rows, found through ix_outbox_published (published_at) WHERE published_at IS NOT NULL
-- (schema_contract.INDEXES): a range of that index, never a scan of the outbox (a
-- sequential scan per batch capped retention near 67 rows/s at 1M rows). `= ANY(ARRAY(...))`,
-- not `IN (...)`: the batch's ids are then probed through the primary key, where a semi
-- join may hash the whole outbox.
DELETE FROM messenger.integration_outbox
WHERE id = ANY (ARRAY(SELECT id FROM messenger.integration_outbox
                      WHERE published_at IS NOT NULL
                        AND published_at < now() - %(retention)s * interval '1 second'
                      ORDER BY published_at LIMIT %(limit)s));

-- name: outbox_stats --
-- The gauges and `safetynet status`: unpublished rows that are not dead letters (through
-- ix_outbox_live: dead letters cost nothing here however many there are), the keys a
-- dead letter blocks (through ix_dead_letters_blocking), and the dead letters kept.
SELECT count(*) AS unpublished,
       COALESCE(EXTRACT(EPOCH FROM now() - min(o.created_at)), 0) AS oldest_age_seconds,
       (SELECT count(*) FROM (
            SELECT DISTINCT d.topic, d.message_key FROM safetynet.outbox_dead_letters d
            WHERE d.blocks_key AND EXISTS (
                SELECT 1 FROM messenger.integration_outbox o2
                WHERE left(o2.topic, 249) = d.topic AND left(o2.message_key, 400) = d.message_key
                  AND o2.id > d.outbox_id AND o2.published_at IS NULL)) k) AS blocked_keys,
       (SELECT count(*) FROM safetynet.outbox_dead_letters) AS dead_lettered
FROM messenger.integration_outbox o
WHERE o.published_at IS NULL
  AND (o.last_error IS NULL OR NOT o.last_error ^@ 'dead-letter:')
  AND NOT EXISTS (SELECT 1 FROM safetynet.outbox_dead_letters d WHERE d.outbox_id = o.id);

-- name: outbox_listen --
LISTEN safetynet_outbox;

-- name: outbox_dead_letters_list --
-- `safetynet dead-letters`: the newest dead letters first, each with its row's state
-- (gone: deleted by the messenger service), whether it still blocks later rows of its
-- key, and the total.
SELECT d.outbox_id, left(d.topic, 256) AS topic, left(d.message_key, 256) AS message_key,
       d.reason, d.blocks_key, d.created_at,
       (o.id IS NULL) AS row_gone, o.publish_attempts,
       (d.blocks_key AND EXISTS (
            SELECT 1 FROM messenger.integration_outbox w
            WHERE left(w.topic, 249) = d.topic AND left(w.message_key, 400) = d.message_key
              AND w.id > d.outbox_id AND w.published_at IS NULL)) AS blocking,
       (SELECT count(*) FROM safetynet.outbox_dead_letters) AS total
FROM safetynet.outbox_dead_letters d
LEFT JOIN messenger.integration_outbox o ON o.id = d.outbox_id
ORDER BY d.created_at DESC, d.outbox_id DESC
LIMIT %(limit)s;

-- name: outbox_dead_letters_lookup --
SELECT d.outbox_id, d.reason, d.blocks_key, (o.id IS NULL) AS row_gone
FROM safetynet.outbox_dead_letters d
LEFT JOIN messenger.integration_outbox o ON o.id = d.outbox_id
WHERE d.outbox_id = ANY(%(ids)s::bigint[])
ORDER BY d.outbox_id
FOR UPDATE OF d;

-- name: outbox_dead_letters_replay --
-- `safetynet replay`: the rows go back on the relay's path (no dead letter, no
-- 'dead-letter:' mark), keeping their publish_attempts; in id order they come before the
-- later rows of their keys, so per-key order holds.
WITH gone AS (
    DELETE FROM safetynet.outbox_dead_letters WHERE outbox_id = ANY(%(ids)s::bigint[])
)
UPDATE messenger.integration_outbox SET last_error = NULL
WHERE id = ANY(%(ids)s::bigint[]) AND published_at IS NULL;

-- name: outbox_wake_relays --
-- What the insert trigger does (migration 0002), for rows put back on the path.
SELECT pg_notify('safetynet_outbox', '');

-- name: outbox_dead_letters_purge --
-- Retention of dead letters (outbox_relay.dead_letter_retention), a small batch per
-- statement, oldest first through ix_dead_letters_created: each dead letter older than
-- %(retention)s seconds goes together with its outbox row (never published: the row
-- would otherwise come back on the relay's path). A dead letter that still blocks later
-- rows of its key is kept: releasing the key is an operator's decision (`safetynet
-- replay`, or deleting the row). Returns the purged ids.
WITH old AS (
    SELECT d.outbox_id FROM safetynet.outbox_dead_letters d
    WHERE d.created_at < now() - %(retention)s * interval '1 second'
      AND NOT (d.blocks_key AND EXISTS (
            SELECT 1 FROM messenger.integration_outbox w
            WHERE left(w.topic, 249) = d.topic AND left(w.message_key, 400) = d.message_key
              AND w.id > d.outbox_id AND w.published_at IS NULL))
    ORDER BY d.created_at, d.outbox_id
    LIMIT %(limit)s
    FOR UPDATE OF d SKIP LOCKED
),
rows_gone AS (
    DELETE FROM messenger.integration_outbox o
    USING old WHERE o.id = old.outbox_id AND o.published_at IS NULL
)
DELETE FROM safetynet.outbox_dead_letters d USING old
WHERE d.outbox_id = old.outbox_id
RETURNING d.outbox_id;
