-- Leadership leases with fencing (issue #14). One row per job: who leads it, under which
-- term, until when (the database's clock, never a daemon's). The lock keeper takes the
-- lease at the start of a cycle, renews it well inside jobs.<job>.lock_ttl and gives it
-- back at the end; every transaction a cycle writes first calls safetynet.lease_fence,
-- so a holder that lost its lease (frozen past its TTL, then resumed) can never commit,
-- however late it wakes.
--
-- Why a row and not only the advisory lock: a session-level advisory lock lives as long
-- as its PostgreSQL session, and the kernel keeps the TCP session of a SIGSTOPped or
-- paused process alive, so a frozen leader would keep the lock for ever. The advisory lock
-- is still taken next to the lease (operators see the leader in pg_locks), but nothing
-- depends on it: a standby takes an expired lease without it.
CREATE TABLE safetynet.leases (
    job varchar(64) PRIMARY KEY,
    holder varchar(256) NOT NULL,          -- host:pid:random of the daemon process
    holder_pid int NOT NULL,               -- backend pid of the holder's lock session
    term bigint NOT NULL CHECK (term >= 0),
    acquired_at timestamptz NOT NULL,
    expires_at timestamptz NOT NULL
);

-- Take *p_job*'s lease for *p_ttl* seconds. It is free when it expired, or when the
-- session that took it is gone (a daemon killed or its lock session terminated: the term
-- changes at once, which fences whatever that daemon still has in flight). The row is
-- locked FOR UPDATE SKIP LOCKED: while any fenced transaction of the current term is in
-- flight (it holds FOR KEY SHARE), nobody can take the lease, so every write of a term
-- commits before the next term starts. Returns the new term, the previous holder and how
-- it let go ('released' at the end of its cycle, 'expired' without a renewal, or
-- 'session_gone' before its TTL), or no row when the lease is held.
CREATE FUNCTION safetynet.lease_acquire(p_job text, p_holder text, p_ttl float8)
RETURNS TABLE (term bigint, previous_holder text, previous_state text)
LANGUAGE plpgsql AS $$
DECLARE
    cur safetynet.leases%ROWTYPE;
    now_ timestamptz := clock_timestamp();
BEGIN
    INSERT INTO safetynet.leases AS l (job, holder, holder_pid, term, acquired_at, expires_at)
    VALUES (p_job, '', 0, 0, now_, '-infinity')
    ON CONFLICT (job) DO NOTHING;
    SELECT * INTO cur FROM safetynet.leases l WHERE l.job = p_job FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN;  -- a fenced transaction of the live term is in flight
    END IF;
    IF cur.expires_at > now_ AND EXISTS (
            SELECT 1 FROM pg_stat_activity a WHERE a.pid = cur.holder_pid) THEN
        RETURN;  -- held, and its holder's session is alive
    END IF;
    UPDATE safetynet.leases l
       SET holder = p_holder, holder_pid = pg_backend_pid(), term = cur.term + 1,
           acquired_at = now_, expires_at = now_ + p_ttl * interval '1 second'
     WHERE l.job = p_job;
    term := cur.term + 1;
    previous_holder := nullif(cur.holder, '');
    previous_state := CASE WHEN cur.expires_at = '-infinity' THEN 'released'
                           WHEN cur.expires_at <= now_ THEN 'expired'
                           ELSE 'session_gone' END;
    RETURN NEXT;
END;
$$;

-- The fence: the first statement of every transaction a cycle writes. It locks the lease
-- row FOR KEY SHARE (renewals still go through; a take-over waits, see lease_acquire) and
-- raises SQLSTATE SN001 when *p_term* is no longer the live term of *p_job*, which rolls
-- the transaction back.
CREATE FUNCTION safetynet.lease_fence(p_job text, p_term bigint)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM safetynet.leases l
     WHERE l.job = p_job AND l.term = p_term AND l.expires_at > clock_timestamp()
       FOR KEY SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'lease lost: % term % is no longer the live term', p_job, p_term
            USING ERRCODE = 'SN001';
    END IF;
END;
$$;
