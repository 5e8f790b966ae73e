-- The outbox relay's logical source (issue 37): a publication of the inserts into
-- messenger.integration_outbox and a logical replication slot with the pgoutput plugin.
-- LSNs travel as numbers (bytes since 0/0): psycopg has no pg_lsn type.

-- name: outbox_wal_level --
SELECT current_setting('wal_level') AS wal_level;

-- name: outbox_publication_create --
-- {publication} is an identifier, composed by psycopg.sql (never a string of ours).
-- Needs ownership of the table (or superuser).
CREATE PUBLICATION {publication} FOR TABLE messenger.integration_outbox
    WITH (publish = 'insert');

-- name: outbox_publication_drop --
DROP PUBLICATION IF EXISTS {publication};

-- name: outbox_publication_describe --
-- The publication's operations and tables (schema.table), or no row.
SELECT p.pubinsert, p.pubupdate, p.pubdelete, p.pubtruncate,
       ARRAY(SELECT t.schemaname || '.' || t.tablename FROM pg_publication_tables t
             WHERE t.pubname = p.pubname ORDER BY 1) AS tables
FROM pg_publication p
WHERE p.pubname = %(publication)s;

-- name: outbox_slot_create --
-- Needs the REPLICATION attribute (or a managed cloud's equivalent role). Waits for the
-- transactions running at that moment to end (the slot's consistent point); never inside
-- a transaction that has written.
SELECT lsn - '0/0'::pg_lsn AS lsn
FROM pg_create_logical_replication_slot(%(slot)s, 'pgoutput');

-- name: outbox_slot_drop --
SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots
WHERE slot_name = %(slot)s;

-- name: outbox_slot_describe --
-- The slot's plugin and database, its confirmed position, the WAL it holds back from the
-- current insert position (bytes: what has been written to WAL, flushed or not — with
-- synchronous_commit off the write position lags the inserts by up to wal_writer_delay),
-- and whether PostgreSQL still keeps that WAL (wal_status), or no row.
SELECT s.plugin, s.database, s.slot_type, s.wal_status, s.active,
       s.confirmed_flush_lsn - '0/0'::pg_lsn AS confirmed_lsn,
       pg_current_wal_insert_lsn() - s.restart_lsn AS retained_bytes
FROM pg_replication_slots s
WHERE s.slot_name = %(slot)s;

-- name: outbox_slot_peek --
-- The next changes past the slot's confirmed position, not consumed: whole transactions
-- of pgoutput messages (protocol 1, inserts of the publication's table only), up to
-- about %(upto_n)s messages (a transaction is never cut), with each message's LSN (a
-- Commit's: the end of its commit record).
SELECT (c.lsn - '0/0'::pg_lsn)::bigint AS lsn, c.data
FROM pg_logical_slot_peek_binary_changes(%(slot)s, NULL, %(upto_n)s,
                                         'proto_version', '1',
                                         'publication_names', %(publication)s) c;

-- name: outbox_slot_wal_position --
-- The WAL position before a peek (PostgreSQL < 17): a peek decodes the WAL flushed to
-- disk, so a transaction committed with synchronous_commit = off shows up once the WAL
-- writer has flushed it (within 3 x wal_writer_delay).
-- With the oldest transaction id still running when the statement's snapshot was taken
-- (before the position is read): every transaction below it ended before that position.
SELECT pg_current_wal_lsn() - '0/0'::pg_lsn AS lsn,
       pg_snapshot_xmin(pg_current_snapshot())::text::bigint AS xmin;

-- name: outbox_slot_wal_flush --
-- The WAL position before a peek (PostgreSQL >= 17), flushed: an empty non-transactional
-- logical message (pgoutput does not send it: the relay does not ask for messages) with
-- flush => true, so transactions committed with synchronous_commit = off are decoded at
-- once too. One tiny WAL record per peek.
SELECT pg_logical_emit_message(false, 'safetynet_outbox', ''::text, true) - '0/0'::pg_lsn
    AS lsn, pg_snapshot_xmin(pg_current_snapshot())::text::bigint AS xmin;

-- name: outbox_slot_advance --
-- Moves the slot's confirmed position to %(lsn)s (never back: the server refuses a
-- position below the confirmed one, so the greater of the two), after every event up to
-- there was acknowledged by Kafka or dead-lettered. Run behind the lease's fence, in the
-- same transaction: a fenced leader's acknowledgements never advance the slot. Returns
-- the slot's new confirmed position.
SELECT a.end_lsn - '0/0'::pg_lsn AS confirmed_lsn
FROM pg_replication_slots s,
     LATERAL pg_replication_slot_advance(
         s.slot_name, GREATEST('0/0'::pg_lsn + %(lsn)s::numeric, s.confirmed_flush_lsn)) a
WHERE s.slot_name = %(slot)s;

-- name: outbox_dead_letters_blocking_keys --
-- The logical source's claim filter: which of these (topic, key) pairs a dead letter
-- blocks, and from which outbox id on (its later events are held, never published out of
-- order). Through ix_dead_letters_blocking.
-- A key with rows held already (marked 'held:', not published: waiting for a replay, or
-- replayed and not yet sent) is blocked from its lowest held id on too, through
-- ix_outbox_held: its later events wait behind them, in order.
WITH k AS (
    SELECT DISTINCT topic, message_key
    FROM unnest(%(topics)s::text[], %(keys)s::text[]) AS k(topic, message_key)
)
SELECT b.topic, b.message_key, min(b.outbox_id) AS outbox_id
FROM (SELECT d.topic, d.message_key, d.outbox_id
      FROM safetynet.outbox_dead_letters d
      JOIN k ON d.topic = left(k.topic, 249) AND d.message_key = left(k.message_key, 400)
      WHERE d.blocks_key
      UNION ALL
      SELECT left(o.topic, 249), left(o.message_key, 400), o.id
      FROM messenger.integration_outbox o
      JOIN k ON o.topic = k.topic AND o.message_key = k.message_key
      WHERE o.published_at IS NULL AND o.last_error ^@ 'held:') b
GROUP BY b.topic, b.message_key;

-- name: outbox_slot_idle --
-- The logical source's idle probe (no lease, no slot acquired): no outbox row above the
-- highest id the relay has read, and the slot holds back less than %(max_retained)s bytes
-- of WAL. A row committed later with a lower id is found by the NOTIFY wake-up, or by the
-- cycle the WAL threshold triggers. Through the outbox's primary key.
SELECT NOT EXISTS (SELECT 1 FROM messenger.integration_outbox o WHERE o.id > %(after_id)s)
   AND COALESCE((SELECT pg_current_wal_lsn() - s.confirmed_flush_lsn < %(max_retained)s
                 FROM pg_replication_slots s WHERE s.slot_name = %(slot)s), false)
       AS idle;

-- name: outbox_slot_wal_keep_size --
-- The most WAL a slot may retain before PostgreSQL invalidates it (-1: unlimited, a
-- forgotten or stuck slot may fill the disk).
SELECT current_setting('max_slot_wal_keep_size') AS keep_size;

-- name: outbox_slot_may_snapshot --
-- Whether this role may log a standby snapshot (pg_log_standby_snapshot, PostgreSQL 16 and
-- later; superusers, or a role granted EXECUTE on it): false on older servers.
SELECT CASE WHEN current_setting('server_version_num')::int >= 160000
            THEN has_function_privilege('pg_catalog.pg_log_standby_snapshot()', 'EXECUTE')
            ELSE false END AS may_snapshot;

-- name: outbox_slot_snapshot --
-- Writes a running-transactions record to the WAL (what the background writer writes every
-- 15 s): once the slot has read past it and moved past it, the slot's restart position moves
-- there, and every later peek and move decodes from there instead of from up to 15 s back.
SELECT pg_log_standby_snapshot() - '0/0'::pg_lsn AS snapshot_lsn;

-- name: outbox_anything_blocking --
-- The logical source's probe at a cycle's start: whether any key is blocked at all (a dead
-- letter that blocks its key, or outbox rows held behind one; both through a partial index,
-- usually empty). When none is, the cycle's pieces skip outbox_dead_letters_blocking_keys:
-- a key this cycle dead-letters is held by the publisher's window for the rest of it.
SELECT EXISTS (SELECT 1 FROM safetynet.outbox_dead_letters WHERE blocks_key)
       OR EXISTS (SELECT 1 FROM messenger.integration_outbox
                  WHERE published_at IS NULL AND last_error ^@ 'held:') AS anything_blocking;
