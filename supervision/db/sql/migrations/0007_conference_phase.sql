-- The conference reaper's three windows, in one definition: the phase a conference is in
-- at AsOf (the first phase whose predicate it meets, as the reaper runs them in order and
-- a conference one phase made terminal is out of the later ones), or NULL when none is
-- due. A STABLE single-expression SQL function, inlined by the planner into the queries
-- that call it (plan_conference_sessions, conference_sessions_active_backlog).
--
-- The claims (conference_sessions_claim_*) keep their own predicate inline: each must be
-- a plain range condition on ix_conf_active (status, last_activity_at) for the index
-- scan in the seed's order. tests/integration/test_plan.py checks on seeded rows that
-- every claim takes exactly the rows this function puts in its phase.
CREATE FUNCTION safetynet.conference_phase(
    p_status text, p_active_participant_count int, p_last_activity_at timestamptz,
    p_created_at timestamptz, p_as_of timestamptz, p_empty_room_grace float8,
    p_provision_timeout float8, p_stale_live_timeout float8)
RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT CASE
        WHEN p_status = 'Active' AND p_active_participant_count = 0
             AND p_last_activity_at <= p_as_of - p_empty_room_grace * interval '1 second'
            THEN 'empty-room'
        WHEN p_status = 'Provisioning'
             AND p_created_at <= p_as_of - p_provision_timeout * interval '1 second'
            THEN 'provision-timeout'
        WHEN p_status = 'Active'
             AND p_last_activity_at <= p_as_of - p_stale_live_timeout * interval '1 second'
            THEN 'stale-live'
    END
$$;
