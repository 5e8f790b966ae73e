-- name: lease_acquire --
-- The job's lease for lock_ttl seconds (see migration 0005): one row (term, the previous
-- holder, how it let go) when taken, no row when another live holder has it.
SELECT term, previous_holder, previous_state
FROM safetynet.lease_acquire(%(job)s, %(holder)s, %(ttl)s);

-- name: lease_renew --
-- Extends the live term only: no row when the term is no longer live (lost).
UPDATE safetynet.leases
   SET expires_at = clock_timestamp() + %(ttl)s * interval '1 second'
 WHERE job = %(job)s AND term = %(term)s AND expires_at > clock_timestamp()
RETURNING term;

-- name: lease_release --
-- Gives the lease back at the end of a cycle (the next tick of any daemon may take it);
-- -infinity tells a lease given back from one that ran out.
UPDATE safetynet.leases
   SET expires_at = '-infinity'
 WHERE job = %(job)s AND term = %(term)s AND expires_at > clock_timestamp()
RETURNING term;

-- name: lease_fence --
-- The first statement of a fenced transaction; SQLSTATE SN001 when the term is not live.
SELECT safetynet.lease_fence(%(job)s, %(term)s);

-- name: leases_list --
-- `status` and tests: every job's lease, with its seconds left on the database clock.
SELECT job, holder, holder_pid, term, acquired_at, expires_at,
       extract(epoch FROM expires_at - clock_timestamp())::float8 AS seconds_left
FROM safetynet.leases
ORDER BY job;

-- name: lease_session_setup --
-- The lock session's commits need not wait for the WAL flush: a lease change lost in a
-- crash was followed by no durable fenced write (WAL is flushed in order), so it is as if
-- it never happened.
SET synchronous_commit = off;
