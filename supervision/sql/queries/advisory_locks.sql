-- name: advisory_lock_try --
-- Session-level, never waits: true when this session now holds the job's lock.
SELECT pg_try_advisory_lock(%(key)s);

-- name: advisory_lock_release --
SELECT pg_advisory_unlock(%(key)s);

-- name: advisory_lock_ping --
SELECT 1;

-- name: advisory_lock_holders --
-- Test and status helper: backends holding the advisory lock *key* (classid/objid halves).
SELECT pid FROM pg_locks
WHERE locktype = 'advisory' AND granted
  AND classid = ((%(key)s::bigint >> 32) & 4294967295)::oid
  AND objid = (%(key)s::bigint & 4294967295)::oid
  AND objsubid = 1;
