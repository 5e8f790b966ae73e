-- name: plan_finalize_attempts --
-- Dry run of finalize_attempts_claim_due: the same selection and phase decision, without
-- locks or writes, in the claim's order (next_attempt_at; ties, which the claim takes in
-- either order, by id). Rows another transaction holds right now are listed too, and
-- said so without waiting or locking: `held` when the finalize row is (the claim would
-- skip it), `recording_held` when its recording is (the commit would skip it). Held
-- means the row's xmax names a transaction this statement's snapshot does not see as
-- completed (a row lock or an update not yet committed; a row locked by several
-- transactions at once, a multixact, is not seen). xmax is a 32-bit xid: it is widened
-- to the snapshot's epoch (the one before, when it is above the snapshot's xmax).
WITH snap AS MATERIALIZED (
    SELECT pg_current_snapshot() AS s,
           pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS top
)
SELECT a.id, a.recording_id, a.session_kind, a.session_id, a.attempts, a.next_attempt_at,
       c.recording_status, c.session_ended_at, c.phase, c.poison_reason,
       now() AS as_of,
       extract(epoch FROM now() - c.session_ended_at)::float8 AS ended_s,
       EXISTS (SELECT 1 FROM messenger.integration_outbox o
               WHERE o.topic = %(topic)s AND o.dedupe_key = a.recording_id::text)
           AS has_event,
       h.held[1] AS held, h.held[2] AS recording_held
FROM messenger.recording_finalize_attempts a
-- the claim's own decision (safetynet.finalize_classify), at the database's now()
CROSS JOIN LATERAL safetynet.finalize_classify(a.recording_id, now(), %(sla)s, %(recheck)s) c
CROSS JOIN snap
CROSS JOIN LATERAL (
    SELECT array_agg(x.v <> 0 AND NOT pg_visible_in_snapshot(
               (CASE WHEN x.wide > snap.top THEN x.wide - 4294967296 ELSE x.wide END)
                   ::text::xid8, snap.s) ORDER BY x.n) AS held
    FROM (SELECT u.v, u.n, (snap.top >> 32 << 32) | u.v AS wide
          FROM unnest(ARRAY[a.xmax::text::bigint,
                            COALESCE((SELECT r.xmax::text::bigint
                                      FROM messenger.call_recordings r
                                      WHERE r.id = a.recording_id), 0)])
               WITH ORDINALITY u(v, n)) x
) h
WHERE a.status = 'Pending' AND a.next_attempt_at <= now()
ORDER BY a.next_attempt_at, a.id
LIMIT %(limit)s;

-- name: plan_conference_sessions --
-- Dry run of the reaper's three phases: each active conference in the phase
-- safetynet.conference_phase puts it in (the one definition of the windows; the claims
-- agree with it, see its migration), in phase order, with the ages the windows were
-- compared with; a poison conference still backed off is held (safetynet.conference_poison).
SELECT k.id, k.status, k.active_participant_count, k.phase,
       extract(epoch FROM k.now - k.last_activity_at)::float8 AS idle_s,
       extract(epoch FROM k.now - k.created_at)::float8 AS age_s,
       EXISTS (SELECT 1 FROM messenger.call_recordings r
               WHERE r.session_kind = 'Conference' AND r.session_id = k.id
                 AND r.status IN ('Pending', 'Recording', 'Uploading')) AS recording_active,
       p.next_attempt_at > k.now AS poison_held, p.reason AS poison_reason,
       p.next_attempt_at AS poison_retry_at
FROM (SELECT c.id, c.status, c.active_participant_count, c.last_activity_at, c.created_at,
             now() AS now,
             safetynet.conference_phase(
                 c.status, c.active_participant_count, c.last_activity_at, c.created_at,
                 now(), %(empty_room_grace)s, %(provision_timeout)s,
                 %(stale_live_timeout)s) AS phase
      FROM messenger.conference_sessions c
      WHERE c.status IN ('Provisioning', 'Active')) k
LEFT JOIN safetynet.conference_poison p ON p.conference_id = k.id
WHERE k.phase IS NOT NULL
ORDER BY array_position(ARRAY['empty-room', 'provision-timeout', 'stale-live'], k.phase),
         CASE WHEN k.phase = 'provision-timeout' THEN k.created_at
              ELSE k.last_activity_at END, k.id
LIMIT %(limit)s;

-- name: plan_integration_outbox --
-- Dry run of outbox_claim_batch: the unpublished rows in id order, each with its age and,
-- when it is held, the dead letter that holds it (its own, or an earlier one of its key).
SELECT o.id, o.topic, o.message_key, o.event_type, o.publish_attempts, o.last_error,
       extract(epoch FROM now() - o.created_at)::float8 AS age_s,
       d.outbox_id AS held_by, d.reason AS held_reason,
       extract(epoch FROM now() - d.created_at)::float8 AS held_for_s
FROM messenger.integration_outbox o
LEFT JOIN LATERAL (
    SELECT x.outbox_id, x.reason, x.created_at
    FROM safetynet.outbox_dead_letters x
    WHERE x.topic = o.topic AND x.message_key = o.message_key
      AND (x.outbox_id = o.id OR (x.blocks_key AND x.outbox_id < o.id))
    ORDER BY x.outbox_id
    LIMIT 1) d ON true
WHERE o.published_at IS NULL
ORDER BY o.id
LIMIT %(limit)s;
