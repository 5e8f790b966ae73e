-- name: job_minutes_add --
-- A lock keeper at the end of a tick (migration 0016): add this tick's figures to its
-- job's row of the current minute (the database's clock, the same on every replica).
-- outcomes: summed name by name; ack_ms_buckets: summed bucket by bucket (upper bounds in
-- milliseconds 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, and above).
INSERT INTO safetynet.job_minutes AS r (job, minute, cycles, outcomes, published,
                                        ack_ms_max, ack_ms_buckets, restarts, lease_changes)
VALUES (%(job)s, date_trunc('minute', now()), %(cycles)s, %(outcomes)s::jsonb, %(published)s,
        %(ack_ms_max)s, %(ack_ms_buckets)s::bigint[], %(restarts)s, %(lease_changes)s)
ON CONFLICT (job, minute) DO UPDATE SET
    cycles = r.cycles + EXCLUDED.cycles,
    outcomes = (SELECT COALESCE(jsonb_object_agg(s.k, s.v), '{}'::jsonb)
                FROM (SELECT e.k, sum(e.v::bigint) AS v
                      FROM (SELECT * FROM jsonb_each_text(r.outcomes)
                            UNION ALL SELECT * FROM jsonb_each_text(EXCLUDED.outcomes))
                           AS e(k, v)
                      GROUP BY e.k) AS s),
    published = r.published + EXCLUDED.published,
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
-- The console's charts: every job's rows of the last %(seconds)s seconds, oldest first
-- (the primary key, one range per job: at most 1,440 rows a job a day).
SELECT job, minute, cycles, outcomes, backlog, oldest_age_s, published, ack_ms_max,
       ack_ms_buckets, restarts, lease_changes
FROM safetynet.job_minutes
WHERE job = ANY(%(jobs)s::text[])
  AND minute >= date_trunc('minute', now()) - %(seconds)s * interval '1 second'
ORDER BY job, minute;

-- name: job_minutes_now --
-- The console: the database's current minute (the charts' right edge).
SELECT date_trunc('minute', now());
