-- name: missing_verdict_acceptances_active --
-- recording-finalize, when a cycle has no evidence of its own: has an operator accepted
-- Missing verdicts for this bucket and prefix, and until when?
SELECT accepted_until, accepted_by, reason
FROM safetynet.missing_verdict_acceptances
WHERE bucket = %(bucket)s AND key_prefix = %(key_prefix)s AND accepted_until > now();

-- name: missing_verdict_acceptances_put --
-- `safetynet accept-missing`: accept (or extend, or shorten) for seconds from now.
INSERT INTO safetynet.missing_verdict_acceptances
    (bucket, key_prefix, reason, accepted_at, accepted_until, accepted_by)
VALUES (%(bucket)s, %(key_prefix)s, left(%(reason)s, 512), now(),
        now() + %(seconds)s * interval '1 second', left(%(accepted_by)s, 256))
ON CONFLICT (bucket, key_prefix) DO UPDATE
SET reason = EXCLUDED.reason, accepted_at = EXCLUDED.accepted_at,
    accepted_until = EXCLUDED.accepted_until, accepted_by = EXCLUDED.accepted_by
RETURNING accepted_at, accepted_until, accepted_by, reason;

-- name: missing_verdict_acceptances_revoke --
-- `safetynet accept-missing --revoke`: the acceptance it ended, if one was in force.
DELETE FROM safetynet.missing_verdict_acceptances
WHERE bucket = %(bucket)s AND key_prefix = %(key_prefix)s
RETURNING accepted_until > now() AS active, accepted_at, accepted_until, accepted_by, reason;
