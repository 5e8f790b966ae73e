-- name: dependency_health_observe --
-- One observation of a dependency by a cycle (fenced, under the job's lease). Healthy:
-- healthy_since stays (or starts now when it was not healthy, or when the last
-- observation is older than max_gap: nobody watched in between). Not healthy: NULL.
-- Returns whether it has now been healthy for at least %(healthy_for)s seconds.
INSERT INTO safetynet.dependency_health AS h (dependency, healthy_since, observed_at)
VALUES (%(dependency)s, CASE WHEN %(healthy)s THEN now() END, now())
ON CONFLICT (dependency) DO UPDATE
SET healthy_since = CASE
        WHEN NOT %(healthy)s THEN NULL
        WHEN h.observed_at < EXCLUDED.observed_at - %(max_gap)s * interval '1 second'
            THEN EXCLUDED.observed_at
        ELSE COALESCE(h.healthy_since, EXCLUDED.observed_at)
    END,
    observed_at = EXCLUDED.observed_at
RETURNING healthy_since IS NOT NULL
          AND healthy_since <= now() - %(healthy_for)s * interval '1 second';

-- name: dependency_health_list --
-- Tests and operators: what the cycles last observed.
SELECT dependency, healthy_since, observed_at
FROM safetynet.dependency_health
ORDER BY dependency;
