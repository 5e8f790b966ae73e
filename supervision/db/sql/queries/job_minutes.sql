-- name: job_minutes_add --
-- A lock keeper at the end of a tick (migration 0016): add this tick's figures to its
-- job's row of the current minute (the database's clock, the same on every replica).
-- ack_ms_buckets: summed bucket by bucket (upper bounds in milliseconds 50, 100, 250, 500,
-- 1000, 2500, 5000, 10000, 30000, and above).
INSERT INTO safetynet.job_minutes AS r (job, minute, cycles, reconciled, republished, failed, quarantined, withheld, config_fault, empty_timeout, provision_failed, stale_timeout, errors, published, failed_ticks,
                                        ack_ms_max, ack_ms_buckets, restarts, lease_changes)
VALUES (%(job)s, date_trunc('minute', now()), %(cycles)s, %(reconciled)s, %(republished)s, %(failed)s, %(quarantined)s, %(withheld)s, %(config_fault)s, %(empty_timeout)s, %(provision_failed)s, %(stale_timeout)s, %(errors)s, %(published)s, %(failed_ticks)s,
        %(ack_ms_max)s, %(ack_ms_buckets)s::bigint[], %(restarts)s, %(lease_changes)s)
ON CONFLICT (job, minute) DO UPDATE SET
    cycles = r.cycles + EXCLUDED.cycles,
    reconciled = r.reconciled + EXCLUDED.reconciled,
    republished = r.republished + EXCLUDED.republished,
    failed = r.failed + EXCLUDED.failed,
    quarantined = r.quarantined + EXCLUDED.quarantined,
    withheld = r.withheld + EXCLUDED.withheld,
    config_fault = r.config_fault + EXCLUDED.config_fault,
    empty_timeout = r.empty_timeout + EXCLUDED.empty_timeout,
    provision_failed = r.provision_failed + EXCLUDED.provision_failed,
    stale_timeout = r.stale_timeout + EXCLUDED.stale_timeout,
    errors = r.errors + EXCLUDED.errors,
    published = r.published + EXCLUDED.published,
    failed_ticks = r.failed_ticks + EXCLUDED.failed_ticks,
    ack_ms_max = GREATEST(r.ack_ms_max, EXCLUDED.ack_ms_max),
    ack_ms_buckets = ARRAY(SELECT COALESCE(a, 0) + COALESCE(b, 0)
                           FROM unnest(r.ack_ms_buckets, EXCLUDED.ack_ms_buckets)
                                WITH ORDINALITY AS u(a, b, i) ORDER BY i),
    restarts = r.restarts + EXCLUDED.restarts,
    lease_changes = r.lease_changes + EXCLUDED.lease_changes;

-- name: job_minutes_backlogs --
-- The scan leader's gauge refresher: each job's backlog and oldest age into its row of
-- the current minute, the largest of the minute (a NULL leaves what was there).
INSERT INTO safetynet.job_minutes AS r (job, minute, backlog, oldest_age_s)
SELECT b.job, date_trunc('minute', now()), b.backlog, b.oldest_age_s
FROM unnest(%(jobs)s::text[], %(backlogs)s::bigint[], %(ages)s::float8[])
     AS b(job, backlog, oldest_age_s)
ON CONFLICT (job, minute) DO UPDATE SET
    backlog = GREATEST(r.backlog, EXCLUDED.backlog),
    oldest_age_s = GREATEST(r.oldest_age_s, EXCLUDED.oldest_age_s);

-- name: job_minutes_prune --
-- Retention: the rows older than %(keep_s)s seconds (ix_job_minutes_minute).
DELETE FROM safetynet.job_minutes
WHERE minute < date_trunc('minute', now()) - %(keep_s)s * interval '1 second';

-- name: job_minutes_since --
-- The console's charts: every job's rows of the last %(seconds)s seconds summed into slots
-- of %(step)s seconds (60: a minute each; 600 for the 24-hour charts, 144 rows a job),
-- oldest first; one range of ix_job_minutes_minute (at most 1,440 rows a job a day).
-- Backlogs: the largest of the slot.
SELECT job, to_timestamp(floor(extract(epoch FROM minute) / %(step)s) * %(step)s) AS minute,
       sum(cycles) AS cycles,
       sum(reconciled) AS reconciled,
       sum(republished) AS republished,
       sum(failed) AS failed,
       sum(quarantined) AS quarantined,
       sum(withheld) AS withheld,
       sum(config_fault) AS config_fault,
       sum(empty_timeout) AS empty_timeout,
       sum(provision_failed) AS provision_failed,
       sum(stale_timeout) AS stale_timeout,
       sum(errors) AS errors,
       sum(published) AS published,
       sum(failed_ticks) AS failed_ticks,
       max(backlog) AS backlog, max(oldest_age_s) AS oldest_age_s,
       max(ack_ms_max) AS ack_ms_max,
       ARRAY[sum(ack_ms_buckets[1]), sum(ack_ms_buckets[2]), sum(ack_ms_buckets[3]),
             sum(ack_ms_buckets[4]), sum(ack_ms_buckets[5]), sum(ack_ms_buckets[6]),
             sum(ack_ms_buckets[7]), sum(ack_ms_buckets[8]), sum(ack_ms_buckets[9]),
             sum(ack_ms_buckets[10])] AS ack_ms_buckets,
       sum(restarts) AS restarts, sum(lease_changes) AS lease_changes
FROM safetynet.job_minutes
WHERE job = ANY(%(jobs)s::text[])
  AND minute >= date_trunc('minute', now()) - %(seconds)s * interval '1 second'
GROUP BY 1, 2
ORDER BY 1, 2;

-- name: job_minutes_now --
-- The console: the database's current minute (the charts' right edge).
SELECT date_trunc('minute', now());
