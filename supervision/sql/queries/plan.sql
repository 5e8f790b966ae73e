-- name: plan_finalize_attempts --
-- Dry run of finalize_attempts_claim_due: the same selection and phase decision, without
-- locks or writes (rows another runner holds right now are listed too).
SELECT a.id, a.recording_id, a.attempts, a.next_attempt_at, r.status AS recording_status,
       s.ended_at AS session_ended_at,
       CASE
           WHEN r.id IS NULL THEN 'poison'
           WHEN r.status IN ('Available', 'Failed') THEN 'terminal'
           WHEN s.problem IS NOT NULL THEN 'poison'
           WHEN s.ended_at IS NULL
                OR s.ended_at > now() - %(sla)s * interval '1 second' THEN 'wait'
           ELSE 'reconcile'
       END AS phase,
       CASE
           WHEN r.id IS NULL THEN 'recording_missing'
           WHEN r.status NOT IN ('Available', 'Failed') THEN s.problem
       END AS poison_reason,
       EXISTS (SELECT 1 FROM messenger.integration_outbox o
               WHERE o.topic = %(topic)s AND o.dedupe_key = a.recording_id::text)
           AS has_event
FROM messenger.recording_finalize_attempts a
LEFT JOIN messenger.call_recordings r ON r.id = a.recording_id
LEFT JOIN LATERAL (
    SELECT e.ended_at,
           CASE
               WHEN r.session_kind NOT IN ('Direct', 'Conference')
                   THEN 'session_kind_unknown:' || left(r.session_kind, 32)
               WHEN e.status IS NULL THEN 'session_missing'
               WHEN e.ended_at > now() + (%(sla)s + %(recheck)s) * interval '1 second'
                   THEN 'session_ended_in_future:'
                        || to_char(e.ended_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
           END AS problem
    FROM (SELECT max(x.status) AS status,
                 max(COALESCE(x.ended_at, CASE WHEN x.status IN ('Ended', 'Failed')
                                               THEN x.updated_at END)) AS ended_at
          FROM (SELECT cs.status, cs.ended_at, cs.updated_at FROM messenger.call_sessions cs
                WHERE r.session_kind = 'Direct' AND cs.id = r.session_id
                UNION ALL
                SELECT cf.status, cf.ended_at, cf.updated_at
                FROM messenger.conference_sessions cf
                WHERE r.session_kind = 'Conference' AND cf.id = r.session_id) x) e
) s ON r.id IS NOT NULL
WHERE a.status = 'Pending' AND a.next_attempt_at <= now()
ORDER BY a.next_attempt_at, a.id
LIMIT %(limit)s;

-- name: plan_conference_sessions --
-- Dry run of the reaper's three phases, in phase order, each conference in the first
-- phase whose predicate it meets (as the reaper's status guard would have it); a poison
-- conference still backed off is held (safetynet.conference_poison).
SELECT c.id, c.status, c.active_participant_count, c.last_activity_at, c.created_at,
       CASE
           WHEN c.status = 'Active' AND c.active_participant_count = 0
                AND c.last_activity_at <= now() - %(empty_room_grace)s * interval '1 second'
               THEN 'empty-room'
           WHEN c.status = 'Provisioning'
                AND c.created_at <= now() - %(provision_timeout)s * interval '1 second'
               THEN 'provision-timeout'
           ELSE 'stale-live'
       END AS phase,
       EXISTS (SELECT 1 FROM messenger.call_recordings r
               WHERE r.session_kind = 'Conference' AND r.session_id = c.id
                 AND r.status IN ('Pending', 'Recording', 'Uploading')) AS recording_active,
       p.next_attempt_at > now() AS poison_held, p.reason AS poison_reason,
       p.next_attempt_at AS poison_retry_at
FROM messenger.conference_sessions c
LEFT JOIN safetynet.conference_poison p ON p.conference_id = c.id
WHERE c.status IN ('Provisioning', 'Active')
  AND ((c.status = 'Active' AND c.active_participant_count = 0
        AND c.last_activity_at <= now() - %(empty_room_grace)s * interval '1 second')
       OR (c.status = 'Provisioning'
           AND c.created_at <= now() - %(provision_timeout)s * interval '1 second')
       OR (c.status = 'Active'
           AND c.last_activity_at <= now() - %(stale_live_timeout)s * interval '1 second'))
ORDER BY phase, c.last_activity_at
LIMIT %(limit)s;

-- name: plan_integration_outbox --
SELECT o.id, o.topic, o.message_key, o.event_type, o.publish_attempts, o.last_error,
       EXISTS (SELECT 1 FROM safetynet.outbox_dead_letters d
               WHERE d.topic = o.topic AND d.message_key = o.message_key
                 AND (d.outbox_id = o.id OR (d.blocks_key AND d.outbox_id < o.id)))
           AS held
FROM messenger.integration_outbox o
WHERE o.published_at IS NULL
ORDER BY o.id
LIMIT %(limit)s;
