-- name: conference_poison_record --
-- Remember the poison conferences of one phase's batch (parallel arrays %(ids)s and
-- %(reasons)s), in the phase's transaction: out of the claim for
-- min(cap, interval * 2^failures) after AsOf. The exponent is bounded, so no overflow.
INSERT INTO safetynet.conference_poison AS p
    (conference_id, phase, reason, failures, first_failed_at, last_failed_at,
     next_attempt_at)
SELECT f.id, %(phase)s::text, left(f.reason, 512), 1, %(as_of)s, %(as_of)s,
       %(as_of)s + LEAST(%(cap)s, %(interval)s * 2) * interval '1 second'
FROM unnest(%(ids)s::uuid[], %(reasons)s::text[]) AS f(id, reason)
ON CONFLICT (conference_id) DO UPDATE
SET phase = EXCLUDED.phase, reason = EXCLUDED.reason, failures = p.failures + 1,
    last_failed_at = EXCLUDED.last_failed_at,
    next_attempt_at = EXCLUDED.last_failed_at
        + LEAST(%(cap)s, %(interval)s * power(2, LEAST(p.failures + 1, 40)))
          * interval '1 second';

-- name: conference_poison_prune --
-- Forget poison conferences that are no longer active (ended by hand or by the messenger
-- service, or deleted): once per cycle, a handful of rows.
DELETE FROM safetynet.conference_poison p
WHERE NOT EXISTS (SELECT 1 FROM messenger.conference_sessions c
                  WHERE c.id = p.conference_id AND c.status IN ('Provisioning', 'Active'));

-- name: conference_poison_list --
-- `safetynet status`: the remembered poison conferences that are still active, oldest
-- first, with how many there are in all.
SELECT p.conference_id, c.status, p.phase, p.failures, p.reason, p.first_failed_at,
       p.next_attempt_at, count(*) OVER () AS total
FROM safetynet.conference_poison p
JOIN messenger.conference_sessions c
  ON c.id = p.conference_id AND c.status IN ('Provisioning', 'Active')
ORDER BY p.first_failed_at, p.conference_id
LIMIT %(limit)s;

-- name: conference_poison_count --
-- safetynet_conf_reaper_poisoned: remembered poison conferences that are still active.
SELECT count(*)
FROM safetynet.conference_poison p
JOIN messenger.conference_sessions c
  ON c.id = p.conference_id AND c.status IN ('Provisioning', 'Active');

-- name: conference_poison_lookup --
-- `safetynet requeue`: which of %(ids)s are remembered poison conferences.
SELECT conference_id, phase, failures, reason
FROM safetynet.conference_poison
WHERE conference_id = ANY(%(ids)s::uuid[]) OR %(all)s
ORDER BY first_failed_at, conference_id;

-- name: conference_poison_release --
-- `safetynet requeue`: forget them, so the next cycle claims them at once (after the
-- operator fixed the row); a poison that still fails is remembered again, failures 1.
DELETE FROM safetynet.conference_poison
WHERE conference_id = ANY(%(ids)s::uuid[]);
