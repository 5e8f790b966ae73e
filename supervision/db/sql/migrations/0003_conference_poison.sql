-- The conference reaper's memory of poison conferences, kept in the safetynet schema (the
-- messenger schema holds exactly SPEC §2). A conference whose guard rejects it (started
-- after AsOf) or whose outcome cannot be written (a duration that overflows) is kept out
-- of the claim until next_attempt_at, a back-off that doubles per failure up to
-- jobs.conference_reaper.poison_backoff_cap, so it cannot starve its phase. Reaping it
-- forgets it; so does `safetynet requeue <conference id>` (retried at the next cycle), or
-- the conference leaving Provisioning/Active by other means (pruned each cycle).
-- No foreign key into messenger: the messenger service must stay free to delete its rows.
CREATE TABLE safetynet.conference_poison (
    conference_id uuid PRIMARY KEY,
    phase varchar(32) NOT NULL,
    reason varchar(512) NOT NULL,
    failures int NOT NULL CHECK (failures > 0),
    first_failed_at timestamptz NOT NULL,
    last_failed_at timestamptz NOT NULL,
    next_attempt_at timestamptz NOT NULL
);
