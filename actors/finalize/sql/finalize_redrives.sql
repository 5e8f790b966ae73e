-- name: finalize_redrives_requeue --
-- Self-healing quarantine, one bounded batch in one transaction: up to %(batch_size)s
-- Quarantined finalize rows whose last_error matches one of %(reasons)s (LIKE patterns of
-- the reasons that belong to a dependency, never poison or bad data) and that were
-- redriven fewer than %(redrive_max)s times are requeued — Pending, attempts 0, due at
-- %(as_of)s (the running cycle claims them) — and their count goes up by one. Rows
-- another transaction holds are skipped. Returns each redriven row with the reason it
-- had and its redrive count now.
WITH picked AS (
    SELECT a.id, a.recording_id, a.last_error
    FROM messenger.recording_finalize_attempts a
    LEFT JOIN safetynet.finalize_redrives f ON f.attempt_id = a.id
    WHERE a.status = 'Quarantined'  -- ix_rfa_due's leading column
      AND a.last_error LIKE ANY(%(reasons)s::text[])
      AND COALESCE(f.redrives, 0) < %(redrive_max)s
    ORDER BY a.updated_at, a.id
    LIMIT %(batch_size)s
    FOR UPDATE OF a SKIP LOCKED
),
counted AS (
    INSERT INTO safetynet.finalize_redrives AS f
        (attempt_id, recording_id, redrives, last_reason, last_redriven_at)
    SELECT p.id, p.recording_id, 1, p.last_error, now() FROM picked p
    ON CONFLICT (attempt_id) DO UPDATE
    SET redrives = f.redrives + 1, last_reason = EXCLUDED.last_reason,
        last_redriven_at = EXCLUDED.last_redriven_at
    RETURNING f.attempt_id, f.redrives
),
requeued AS (
    UPDATE messenger.recording_finalize_attempts a
    SET status = 'Pending', attempts = 0, next_attempt_at = %(as_of)s, last_error = NULL,
        updated_at = now()
    FROM picked p
    WHERE a.id = p.id
    RETURNING a.id
)
SELECT p.id, p.recording_id, p.last_error, c.redrives
FROM picked p
JOIN counted c ON c.attempt_id = p.id
JOIN requeued r ON r.id = p.id
ORDER BY p.id;

-- name: finalize_redrives_prune --
-- Forget the counts of rows that are Done or gone (a bounded handful per cycle).
DELETE FROM safetynet.finalize_redrives
WHERE attempt_id IN (
    SELECT f.attempt_id
    FROM safetynet.finalize_redrives f
    LEFT JOIN messenger.recording_finalize_attempts a ON a.id = f.attempt_id
    WHERE a.id IS NULL OR a.status = 'Done'
    LIMIT %(limit)s
);

-- name: finalize_redrives_forget --
-- `safetynet requeue`: a person acted; the row's automatic redrives start again from 0.
DELETE FROM safetynet.finalize_redrives
WHERE attempt_id = ANY(%(ids)s::uuid[]);

-- name: finalize_redrives_list --
-- Tests and operators: every row redriven so far.
SELECT attempt_id, recording_id, redrives, last_reason, last_redriven_at
FROM safetynet.finalize_redrives
ORDER BY attempt_id;
