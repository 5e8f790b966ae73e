-- One definition of what recording-finalize does with a due row, shared by the claim
-- (finalize_attempts_claim_due) and its dry run (plan_finalize_attempts): `safetynet
-- plan` cannot drift from the daemon. A STABLE single-SELECT SQL function, inlined by the
-- planner into the queries that call it.
--
-- phase: poison (no recording; or no session to wait for: missing, unknown kind, an end
--        beyond AsOf + SLA + recheck), terminal (recording Available/Failed already), wait
--        (session live or ended less than the SLA ago), reconcile (HEAD the object).
-- The session's end is ended_at, or, for a session Ended/Failed without one (a failed
-- call), the time it got that status.
CREATE FUNCTION safetynet.finalize_classify(
    p_recording_id uuid, p_as_of timestamptz, p_sla float8, p_recheck float8)
RETURNS TABLE (found_recording_id uuid, recording_status text, tenant_id uuid,
               session_ended_at timestamptz, phase text, poison_reason text)
LANGUAGE sql STABLE AS $$
    SELECT r.id, r.status::text, r.tenant_id, s.ended_at,
           CASE
               WHEN r.id IS NULL THEN 'poison'
               WHEN r.status IN ('Available', 'Failed') THEN 'terminal'
               WHEN s.problem IS NOT NULL THEN 'poison'
               WHEN s.ended_at IS NULL
                    OR s.ended_at > p_as_of - p_sla * interval '1 second' THEN 'wait'
               ELSE 'reconcile'
           END,
           CASE
               WHEN r.id IS NULL THEN 'recording_missing'
               WHEN r.status NOT IN ('Available', 'Failed') THEN s.problem
           END
    FROM (SELECT p_recording_id AS id) k
    LEFT JOIN messenger.call_recordings r ON r.id = k.id
    LEFT JOIN LATERAL (
        SELECT e.ended_at,
               CASE
                   WHEN r.session_kind NOT IN ('Direct', 'Conference')
                       THEN 'session_kind_unknown:' || left(r.session_kind, 32)
                   WHEN e.status IS NULL THEN 'session_missing'
                   WHEN e.ended_at > p_as_of + (p_sla + p_recheck) * interval '1 second'
                       THEN 'session_ended_in_future:'
                            || to_char(e.ended_at AT TIME ZONE 'UTC',
                                       'YYYY-MM-DD"T"HH24:MI:SS"Z"')
               END AS problem
        FROM (SELECT max(x.status) AS status,
                     max(COALESCE(x.ended_at, CASE WHEN x.status IN ('Ended', 'Failed')
                                                   THEN x.updated_at END)) AS ended_at
              FROM (SELECT cs.status, cs.ended_at, cs.updated_at
                    FROM messenger.call_sessions cs
                    WHERE r.session_kind = 'Direct' AND cs.id = r.session_id
                    UNION ALL
                    SELECT cf.status, cf.ended_at, cf.updated_at
                    FROM messenger.conference_sessions cf
                    WHERE r.session_kind = 'Conference' AND cf.id = r.session_id) x) e
    ) s ON r.id IS NOT NULL
$$;
