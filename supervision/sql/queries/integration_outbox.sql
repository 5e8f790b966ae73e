-- name: outbox_claim_batch --
-- The next unpublished rows in id order. Skips rows another relay holds, dead-lettered
-- rows, every row of a key blocked behind a dead letter of that key (per-key order is
-- never broken; a blocked key raises an alert instead), and the rows of topics held by
-- a configuration fault (so they never fill the batch and starve the other topics).
-- The payload comes as text: it is sent as it is stored (jsonb's canonical JSON), with
-- no parse/serialise round trip in Python; its JSON type says whether it is an object.
-- Within a cycle the next claim runs while the rows of the previous ones are still being
-- sent or marked: behind a backlog it takes the rows after the last claimed id; caught up
-- (the last claim was short) it starts from the beginning again, so a row that committed
-- after rows with higher ids (concurrent writers) is not passed over, and skips the ids
-- this cycle claimed and has not marked yet.
SELECT o.id, o.topic, o.message_key, o.dedupe_key, o.event_type, o.payload::text AS payload,
       jsonb_typeof(o.payload) AS payload_type, o.headers
FROM messenger.integration_outbox o
WHERE o.published_at IS NULL
  AND o.id > %(after_id)s
  AND o.id <> ALL(%(skip)s::bigint[])
  AND o.topic <> ALL(%(held_topics)s::text[])
  AND NOT EXISTS (SELECT 1 FROM safetynet.outbox_dead_letters d
                  WHERE d.topic = o.topic AND d.message_key = o.message_key
                    AND (d.outbox_id = o.id OR (d.blocks_key AND d.outbox_id < o.id)))
ORDER BY o.id
LIMIT %(batch_size)s
FOR UPDATE OF o SKIP LOCKED;

-- name: outbox_has_publishable --
-- The relay's idle probe, before it takes its lease: is any row waiting that a claim
-- would take (the claim's filter, without the topics held in memory and without locks)?
SELECT EXISTS (
    SELECT 1 FROM messenger.integration_outbox o
    WHERE o.published_at IS NULL
      AND NOT EXISTS (SELECT 1 FROM safetynet.outbox_dead_letters d
                      WHERE d.topic = o.topic AND d.message_key = o.message_key
                        AND (d.outbox_id = o.id OR (d.blocks_key AND d.outbox_id < o.id))));

-- name: outbox_mark_published --
-- Only after the broker acknowledged each of these rows.
UPDATE messenger.integration_outbox
SET published_at = now(), publish_attempts = publish_attempts + 1, last_error = NULL
WHERE id = ANY(%(ids)s) AND published_at IS NULL;

-- name: outbox_mark_failed --
UPDATE messenger.integration_outbox
SET publish_attempts = publish_attempts + 1, last_error = %(last_error)s
WHERE id = ANY(%(ids)s) AND published_at IS NULL;

-- name: outbox_dead_letter --
-- A message the broker (or the client) rejects permanently, or a malformed row: never
-- retried, never published. It blocks its key only when later rows of that key are already waiting.
WITH dead AS (
    INSERT INTO safetynet.outbox_dead_letters (outbox_id, topic, message_key, reason, blocks_key)
    SELECT o.id, o.topic, o.message_key, %(reason)s,
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
        last_error = %(reason)s
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
SELECT count(*) AS unpublished,
       COALESCE(EXTRACT(EPOCH FROM now() - min(created_at)), 0) AS oldest_age_seconds,
       (SELECT count(DISTINCT (d.topic, d.message_key)) FROM safetynet.outbox_dead_letters d
        WHERE d.blocks_key AND EXISTS (
            SELECT 1 FROM messenger.integration_outbox o2
            WHERE o2.topic = d.topic AND o2.message_key = d.message_key
              AND o2.id > d.outbox_id AND o2.published_at IS NULL)) AS blocked_keys,
       (SELECT count(*) FROM safetynet.outbox_dead_letters) AS dead_lettered
FROM messenger.integration_outbox
WHERE published_at IS NULL
  AND id NOT IN (SELECT outbox_id FROM safetynet.outbox_dead_letters);

-- name: outbox_listen --
LISTEN safetynet_outbox;
