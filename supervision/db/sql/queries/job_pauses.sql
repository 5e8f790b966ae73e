-- name: job_pauses_get --
-- The lock keeper, right before it would take the job's lease: is the job paused?
SELECT reason, paused_at, paused_by
FROM safetynet.job_pauses
WHERE job = %(job)s AND (expires_at IS NULL OR expires_at > now());

-- name: job_pauses_insert --
-- `safetynet pause`: no row when the job was paused already (the first pause stands); a
-- pause past its expiry (migration 0012) is replaced. %(seconds)s NULL: until resumed.
INSERT INTO safetynet.job_pauses (job, reason, paused_at, paused_by, expires_at)
VALUES (%(job)s, left(%(reason)s, 512), now(), left(%(paused_by)s, 256),
        now() + %(seconds)s::float8 * interval '1 second')
ON CONFLICT (job) DO UPDATE
    SET reason = EXCLUDED.reason, paused_at = EXCLUDED.paused_at,
        paused_by = EXCLUDED.paused_by, expires_at = EXCLUDED.expires_at
    WHERE safetynet.job_pauses.expires_at <= now()
RETURNING reason, paused_at, paused_by;

-- name: job_pauses_delete --
-- `safetynet resume`: the pause it ended, or no row when the job was not paused.
DELETE FROM safetynet.job_pauses
WHERE job = %(job)s
RETURNING reason, paused_at, paused_by;

-- name: job_pauses_list --
-- `safetynet status`: every paused job, with how long it has been paused.
SELECT job, reason, paused_at, paused_by,
       round(extract(epoch FROM now() - paused_at)::numeric, 1)::float8 AS paused_for_seconds,
       expires_at
FROM safetynet.job_pauses
WHERE expires_at IS NULL OR expires_at > now()
ORDER BY job;
