-- Issue 37: which source the outbox relay last read, so a switch between the table and
-- the logical source (or the fall back to the table when the slot is lost) loses no
-- event and republishes as few as possible.
--
-- One row. `source` is the source that relayed last. `passed_xid` (logical source): every
-- transaction whose id (xid8) is below it had ended before a WAL position the slot has
-- since passed, so its outbox rows are delivered (acknowledged, dead-lettered, or held
-- behind a dead letter of their key); the table source marks those rows published before
-- it claims (actors/outbox/handover.py). Written when the source changes and at most every
-- few seconds while the slot advances: never per event.
CREATE TABLE IF NOT EXISTS safetynet.outbox_relay_source (
    id boolean PRIMARY KEY DEFAULT true CHECK (id),
    source text NOT NULL CHECK (source IN ('table', 'logical')),
    passed_xid bigint CHECK (passed_xid >= 0),
    updated_at timestamptz NOT NULL DEFAULT now()
);
