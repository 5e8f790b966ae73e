-- Issue 38, item 1: the console's charts read a rollup safetynet owns, one row per job per
-- minute, so the pictures survive restarts and read the same on every replica.
--
-- * The lock keepers add to their job's row at the end of each tick that ran a cycle (an
--   upsert adding the cycle's counts: never a row per event): `cycles`, the verdicts by
--   outcome (recording-finalize's reconciled, republished, failed, quarantined, withheld,
--   config_fault; the conference reaper's empty_timeout, provision_failed, stale_timeout,
--   errors; the relay's published and failed), `failed_ticks` (a cycle that overran its
--   lease or met a server going away), the relay's commit-to-ack latency (`ack_ms_max`
--   and `ack_ms_buckets`, counts per fixed bucket, see
--   supervision/db/sql/queries/job_minutes.sql), `restarts` (the keeper started) and
--   `lease_changes` (the lease taken over from another holder, or lost).
-- * The scan leader's gauge refresher sets `backlog` and `oldest_age_s` (the largest seen
--   in the minute) and deletes the rows older than eight days.
-- A column a row, not a document: the 24-hour charts sum 1,440 rows a job in the database.
-- Nothing of the messenger's is touched; a failed write never fails a cycle.
CREATE TABLE safetynet.job_minutes (
    job text CHECK (char_length(job) <= 64) NOT NULL,
    minute timestamptz NOT NULL CHECK (date_trunc('minute', minute) = minute),
    cycles integer NOT NULL DEFAULT 0,
    reconciled integer NOT NULL DEFAULT 0,
    republished integer NOT NULL DEFAULT 0,
    failed integer NOT NULL DEFAULT 0,
    quarantined integer NOT NULL DEFAULT 0,
    withheld integer NOT NULL DEFAULT 0,
    config_fault integer NOT NULL DEFAULT 0,
    empty_timeout integer NOT NULL DEFAULT 0,
    provision_failed integer NOT NULL DEFAULT 0,
    stale_timeout integer NOT NULL DEFAULT 0,
    errors integer NOT NULL DEFAULT 0,
    published integer NOT NULL DEFAULT 0,
    failed_ticks integer NOT NULL DEFAULT 0,
    backlog bigint,
    oldest_age_s double precision,
    ack_ms_max bigint NOT NULL DEFAULT 0,
    ack_ms_buckets bigint[] NOT NULL DEFAULT '{0,0,0,0,0,0,0,0,0,0}',
    restarts integer NOT NULL DEFAULT 0,
    lease_changes integer NOT NULL DEFAULT 0,
    PRIMARY KEY (job, minute)
);
-- retention: the rows past eight days, whatever their job
CREATE INDEX ix_job_minutes_minute ON safetynet.job_minutes (minute);
