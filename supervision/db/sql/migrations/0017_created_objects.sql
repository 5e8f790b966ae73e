-- Issue 36, item 10: what safetynet created on the messenger's tables, recorded when it
-- created it, so that `safetynet uninstall` removes exactly that and never an index the
-- messenger had under the same name (its own ix_rfa_due, say, which migrate reuses).
--
-- migrate adds a row in the same run as each index it builds CONCURRENTLY and when it
-- installs the NOTIFY trigger, and removes the trigger's row when it drops it (wakeup =
-- poll). The objects earlier releases built are recorded once, by the migrate that
-- applies this file, when it can prove they are safetynet's (how = 'backfilled'): the
-- trigger that calls safetynet.notify_outbox(), and an index under the contract's name
-- with the contract's definition created after the safetynet schema (a higher OID), which
-- an index the messenger had before the install never is.
CREATE TABLE safetynet.created_objects (
    kind text NOT NULL CHECK (kind IN ('index', 'trigger')),
    name text NOT NULL CHECK (char_length(name) <= 63),
    table_name text NOT NULL CHECK (char_length(table_name) <= 63),
    how text NOT NULL CHECK (how IN ('built', 'backfilled')),
    created_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
    PRIMARY KEY (kind, name)
);
