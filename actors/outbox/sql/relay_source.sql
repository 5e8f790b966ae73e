-- The relay's source hand-over (issue 37, migration 0018): which source relayed last and,
-- for the logical source, the transaction id below which the slot has passed every
-- transaction (actors/outbox/handover.py).

-- name: outbox_relay_source_get --
SELECT source, passed_xid FROM safetynet.outbox_relay_source WHERE id;

-- name: outbox_relay_source_set --
INSERT INTO safetynet.outbox_relay_source (id, source, passed_xid, updated_at)
VALUES (true, %(source)s, %(passed_xid)s, now())
ON CONFLICT (id) DO UPDATE
SET source = EXCLUDED.source, passed_xid = EXCLUDED.passed_xid, updated_at = now();

-- fragment: passed --
-- An outbox row the logical source's slot has passed: written by a transaction older
-- than %(passed_xid)s (age() compares 32-bit transaction ids from the current one; a
-- frozen row is the oldest), unpublished in the table's terms, not a dead letter and not
-- held behind a dead letter of its key (marked 'held:' by the logical source, or not yet:
-- those stay for `safetynet replay`).
o.published_at IS NULL
AND (o.last_error IS NULL OR NOT (o.last_error ^@ 'dead-letter:' OR o.last_error ^@ 'held:'))
AND age(o.xmin) > age(%(passed_xid)s::text::xid)
AND NOT EXISTS (SELECT 1 FROM safetynet.outbox_dead_letters d WHERE d.outbox_id = o.id)
AND NOT EXISTS (SELECT 1 FROM safetynet.outbox_dead_letters d
                WHERE d.blocks_key AND d.topic = left(o.topic, 249)
                  AND d.message_key = left(o.message_key, 400) AND d.outbox_id < o.id)

-- name: outbox_mark_passed --
-- Before the table source claims after the logical source (a switch, or the slot lost):
-- mark published a batch of the rows the slot passed, through ix_outbox_live; run until
-- fewer than %(batch)s come back. One write of each such row, once.
UPDATE messenger.integration_outbox
SET published_at = now()
WHERE id IN (SELECT o.id FROM messenger.integration_outbox o WHERE @{passed}
             ORDER BY o.id LIMIT %(batch)s);

-- name: outbox_unpublished_passed --
-- Before the logical source reads after the table source: is a row of a transaction that
-- ended before the slot's new start still unpublished (a failure, a back-off)? Then the
-- table source goes on until none is.
SELECT EXISTS (SELECT 1 FROM messenger.integration_outbox o WHERE @{passed}) AS waiting;

-- name: outbox_delete_passed_before --
-- Retention in the logical source, in small batches: rows older than %(retention)s seconds
-- that the slot has passed (delivered: the logical source never sets published_at),
-- oldest first through ix_outbox_created (created_at), never a scan of the outbox. Rows
-- held behind a dead letter of their key, and dead letters, are not passed: they stay.
DELETE FROM messenger.integration_outbox
WHERE id = ANY (ARRAY(SELECT o.id FROM messenger.integration_outbox o
                      WHERE o.created_at < now() - %(retention)s * interval '1 second'
                        AND @{passed}
                      ORDER BY o.created_at LIMIT %(limit)s));

-- name: outbox_mark_held --
-- The logical source passes the events of a key a dead letter (or an earlier held row)
-- blocks: marked, so they are found through ix_outbox_held once the key is released
-- (`safetynet replay`) and never taken for delivered. Rare: only a blocked key's rows.
UPDATE messenger.integration_outbox
SET last_error = 'held: behind an earlier event of its key that is not delivered'
WHERE id = ANY(%(ids)s::bigint[]) AND published_at IS NULL;

-- name: outbox_claim_held --
-- The logical source's held rows whose key nothing blocks any more (a replay released
-- it), in id order, through ix_outbox_held; the columns of outbox_claim_batch (no byte
-- cap: held rows are few, a row over %(max_row_bytes)s comes without its payload).
WITH held AS (
    SELECT o.id,
           octet_length(o.payload::text) + octet_length(o.headers::text)
             + octet_length(o.topic) + octet_length(o.message_key)
             + octet_length(o.dedupe_key) + octet_length(o.event_type) AS size
    FROM messenger.integration_outbox o
    WHERE o.published_at IS NULL AND o.last_error ^@ 'held:'
      AND NOT EXISTS (SELECT 1 FROM safetynet.outbox_dead_letters d WHERE d.outbox_id = o.id)
      AND NOT EXISTS (SELECT 1 FROM safetynet.outbox_dead_letters d
                      WHERE d.blocks_key AND d.topic = left(o.topic, 249)
                        AND d.message_key = left(o.message_key, 400) AND d.outbox_id < o.id)
    ORDER BY o.id
    LIMIT %(batch_size)s
)
SELECT o.id,
       CASE WHEN h.size > %(max_row_bytes)s THEN left(o.topic, 256) ELSE o.topic END,
       CASE WHEN h.size > %(max_row_bytes)s THEN left(o.message_key, 256)
            ELSE o.message_key END,
       CASE WHEN h.size > %(max_row_bytes)s THEN NULL ELSE o.dedupe_key END,
       CASE WHEN h.size > %(max_row_bytes)s THEN NULL ELSE o.event_type END,
       CASE WHEN h.size > %(max_row_bytes)s THEN NULL ELSE o.payload::text END,
       jsonb_typeof(o.payload),
       CASE WHEN h.size > %(max_row_bytes)s THEN NULL ELSE o.headers::text END,
       h.size, h.size > %(max_row_bytes)s, count(*) OVER ()
FROM held h
JOIN messenger.integration_outbox o ON o.id = h.id
ORDER BY o.id;

-- name: outbox_stats_logical --
-- The gauges, `safetynet status` and the console in the logical source, which never sets
-- published_at: of the newest 10,000 live rows (through ix_outbox_live, backwards), those
-- the slot has not passed as the relay last recorded it (every row before the relay's
-- first record), and the held ones; the oldest of them; the blocked keys and the dead
-- letters as in outbox_stats. Capped: a relay more than 10,000 events behind shows
-- 10,000 (safetynet_outbox_replication_lag_bytes says how far).
WITH r AS (
    SELECT (SELECT mod(passed_xid, 4294967296)::text::xid FROM safetynet.outbox_relay_source
            WHERE id AND source = 'logical') AS passed
),
newest AS (
    SELECT o.id, o.created_at, o.last_error, age(o.xmin) AS xmin_age
    FROM messenger.integration_outbox o
    WHERE o.published_at IS NULL
      AND (o.last_error IS NULL OR NOT o.last_error ^@ 'dead-letter:')
    ORDER BY o.id DESC
    LIMIT 10000
),
waiting AS (
    SELECT n.created_at FROM newest n, r
    WHERE NOT COALESCE(n.xmin_age > age(r.passed)
                       AND (n.last_error IS NULL OR NOT n.last_error ^@ 'held:'), false)
      AND NOT EXISTS (SELECT 1 FROM safetynet.outbox_dead_letters d WHERE d.outbox_id = n.id)
)
SELECT (SELECT count(*) FROM waiting) AS unpublished,
       COALESCE(EXTRACT(EPOCH FROM now() - (SELECT min(created_at) FROM waiting)), 0)::float8
           AS oldest_age_seconds,
       (SELECT count(*) FROM (
            SELECT DISTINCT d.topic, d.message_key FROM safetynet.outbox_dead_letters d
            WHERE d.blocks_key AND EXISTS (
                SELECT 1 FROM messenger.integration_outbox o2
                WHERE left(o2.topic, 249) = d.topic AND left(o2.message_key, 400) = d.message_key
                  AND o2.id > d.outbox_id AND o2.published_at IS NULL)) k) AS blocked_keys,
       (SELECT count(*) FROM safetynet.outbox_dead_letters) AS dead_lettered;
