-- Issue 38, item 1: the console's charts read a rollup safetynet owns, one row per job per
-- minute, so the pictures survive restarts and read the same on every replica.
--
-- * The lock keepers add to their job's row at the end of each tick that ran a cycle (an
--   upsert adding the cycle's counts: never a row per event): `cycles`, `outcomes` (the
--   cycle's non-zero counts by name, summed: reconciled, republished, failed, quarantined,
--   withheld, config_fault, ...; the reaper's and the relay's own), `published` and the
--   relay's commit-to-ack latency (`ack_ms_max` and `ack_ms_buckets`, counts per fixed
--   bucket, see supervision/db/sql/queries/job_minutes.sql), `restarts` (the keeper started
--   again) and `lease_changes` (the lease taken over from another holder, or lost).
-- * The scan leader's gauge refresher sets `backlog` and `oldest_age_s` (the largest seen
--   in the minute) and deletes the rows older than eight days.
-- Nothing of the messenger's is touched; a failed write never fails a cycle.
CREATE TABLE safetynet.job_minutes (
    job text CHECK (char_length(job) <= 64) NOT NULL,
    minute timestamptz NOT NULL CHECK (date_trunc('minute', minute) = minute),
    cycles integer NOT NULL DEFAULT 0,
    outcomes jsonb NOT NULL DEFAULT '{}',
    backlog bigint,
    oldest_age_s double precision,
    published bigint NOT NULL DEFAULT 0,
    ack_ms_max bigint NOT NULL DEFAULT 0,
    ack_ms_buckets bigint[] NOT NULL DEFAULT '{0,0,0,0,0,0,0,0,0,0}',
    restarts integer NOT NULL DEFAULT 0,
    lease_changes integer NOT NULL DEFAULT 0,
    PRIMARY KEY (job, minute)
);
-- retention: the rows past eight days, whatever their job
CREATE INDEX ix_job_minutes_minute ON safetynet.job_minutes (minute);
