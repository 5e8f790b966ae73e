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

-- name: advisory_lock_mark_lease_era --
-- Taken once per lock session, for its life: the session of a lease-era daemon (migration
-- 0005 on) holds this shared advisory lock; a daemon of the advisory-lock release before
-- it never does. lease_acquire's callers tell the two apart by it.
SELECT pg_advisory_lock_shared(%(marker)s);

-- name: advisory_lock_older_holders --
-- Sessions of an advisory-lock-only release (before migration 0005) holding the job's
-- lock *key*: its holders without the lease-era marker. Such a replica leads by the lock
-- alone, so a lease-era daemon must not lead beside it (rolling upgrade, issue 28).
SELECT count(*) FROM pg_locks l
WHERE l.locktype = 'advisory' AND l.granted AND l.pid <> pg_backend_pid()
  AND l.classid = ((%(key)s::bigint >> 32) & 4294967295)::oid
  AND l.objid = (%(key)s::bigint & 4294967295)::oid
  AND l.objsubid = 1
  AND NOT EXISTS (
      SELECT 1 FROM pg_locks m
      WHERE m.pid = l.pid AND m.locktype = 'advisory' AND m.granted
        AND m.classid = ((%(marker)s::bigint >> 32) & 4294967295)::oid
        AND m.objid = (%(marker)s::bigint & 4294967295)::oid
        AND m.objsubid = 1);
