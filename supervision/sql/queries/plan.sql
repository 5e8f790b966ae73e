-- name: plan_finalize_attempts --
-- Dry run of finalize_attempts_claim_due: the same selection and phase decision, without
-- locks or writes (rows another runner holds right now are listed too).
SELECT a.id, a.recording_id, a.attempts, a.next_attempt_at, c.recording_status,
       c.session_ended_at, c.phase, c.poison_reason,
       EXISTS (SELECT 1 FROM messenger.integration_outbox o
               WHERE o.topic = %(topic)s AND o.dedupe_key = a.recording_id::text)
           AS has_event
FROM messenger.recording_finalize_attempts a
-- the claim's own decision (safetynet.finalize_classify), at the database's now()
CROSS JOIN LATERAL safetynet.finalize_classify(a.recording_id, now(), %(sla)s, %(recheck)s) c
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
