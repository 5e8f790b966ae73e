-- The outbox relay's own bookkeeping, kept in the safetynet schema (the messenger schema
-- holds exactly SPEC §2), and the function of the NOTIFY that wakes relays when any writer
-- (safetynet or the messenger service) commits outbox rows. The trigger that calls it, on
-- the messenger's table, is not a ledger migration since issue 28: `safetynet migrate`
-- installs it (or drops it, with [postgres] wakeup = "poll") under a short lock_timeout,
-- retried (supervision/migrate.py); a database migrated before keeps the old checksum.
CREATE TABLE safetynet.outbox_dead_letters (
    outbox_id bigint PRIMARY KEY,
    topic text NOT NULL,
    message_key text NOT NULL,
    reason varchar(512) NOT NULL,
    -- true when later rows of the same key were waiting at rejection time: they stay
    -- unpublished (per-key order) until an operator releases the key
    blocks_key boolean NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX ix_dead_letters_key ON safetynet.outbox_dead_letters (topic, message_key);

CREATE FUNCTION safetynet.notify_outbox() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- delivered at COMMIT, once per transaction however many rows it wrote
    PERFORM pg_notify('safetynet_outbox', '');
    RETURN NULL;
END;
$$;
