-- fragment: conference_not_backed_off --
-- A poison conference is out of every claim while backed off.
NOT EXISTS (SELECT 1 FROM safetynet.conference_poison p
            WHERE p.conference_id = c.id AND p.next_attempt_at > %(as_of)s)

-- fragment: conference_due_empty_room --
c.status = 'Active' AND c.active_participant_count = 0
  AND c.last_activity_at <= %(as_of)s - %(window)s * interval '1 second'
  AND @{conference_not_backed_off}

-- fragment: conference_due_provision_timeout --
c.status = 'Provisioning'
  AND c.created_at <= %(as_of)s - %(window)s * interval '1 second'
  AND @{conference_not_backed_off}

-- fragment: conference_due_stale_live --
c.status = 'Active'
  AND c.last_activity_at <= %(as_of)s - %(window)s * interval '1 second'
  AND @{conference_not_backed_off}

-- name: conference_sessions_claim_empty_room --
-- Phase 1 (INV-CONF-8): Active rooms nobody is in since empty_room_grace before AsOf.
-- Each claim takes up to batch_size due rows in the seed's order through ix_conf_active
-- and locks them FOR UPDATE SKIP LOCKED (rows held by join/leave/end-conference or by a
-- peer runner are passed over without waiting). Returns the claimed ids and, on every row
-- (or on one all-NULL row when nothing was claimed), how many of the first batch_size due
-- rows were skipped because another transaction holds them. A poison conference is out of
-- every claim while backed off (safetynet.conference_poison.next_attempt_at after AsOf),
-- so batch_size of them cannot starve a phase. The locking read states the phase's
-- condition again (a fragment, written once): a row changed meanwhile is re-checked
-- against it when locked.
WITH candidates AS (
    SELECT c.id
    FROM messenger.conference_sessions c
    WHERE @{conference_due_empty_room}
    ORDER BY c.last_activity_at, c.id
    LIMIT %(batch_size)s
),
claimed AS (
    SELECT c.id, c.last_activity_at AS sort_key
    FROM messenger.conference_sessions c
    WHERE @{conference_due_empty_room}
    ORDER BY c.last_activity_at, c.id
    LIMIT %(batch_size)s
    FOR UPDATE SKIP LOCKED
)
SELECT cl.id, k.skipped_locked
FROM (SELECT GREATEST(0, (SELECT count(*) FROM candidates) - (SELECT count(*) FROM claimed))
          AS skipped_locked) k
LEFT JOIN claimed cl ON true
ORDER BY cl.sort_key, cl.id;

-- name: conference_sessions_claim_provision_timeout --
-- Phase 2: Provisioning rooms the media stack never admitted within provision_timeout.
-- Same shape as the empty-room claim; oldest created first.
WITH candidates AS (
    SELECT c.id
    FROM messenger.conference_sessions c
    WHERE @{conference_due_provision_timeout}
    ORDER BY c.created_at, c.id
    LIMIT %(batch_size)s
),
claimed AS (
    SELECT c.id, c.created_at AS sort_key
    FROM messenger.conference_sessions c
    WHERE @{conference_due_provision_timeout}
    ORDER BY c.created_at, c.id
    LIMIT %(batch_size)s
    FOR UPDATE SKIP LOCKED
)
SELECT cl.id, k.skipped_locked
FROM (SELECT GREATEST(0, (SELECT count(*) FROM candidates) - (SELECT count(*) FROM claimed))
          AS skipped_locked) k
LEFT JOIN claimed cl ON true
ORDER BY cl.sort_key, cl.id;

-- name: conference_sessions_claim_stale_live --
-- Phase 3: Active rooms without presence activity for stale_live_timeout (heartbeats
-- stopped, the room never formally emptied). Same shape as the empty-room claim.
WITH candidates AS (
    SELECT c.id
    FROM messenger.conference_sessions c
    WHERE @{conference_due_stale_live}
    ORDER BY c.last_activity_at, c.id
    LIMIT %(batch_size)s
),
claimed AS (
    SELECT c.id, c.last_activity_at AS sort_key
    FROM messenger.conference_sessions c
    WHERE @{conference_due_stale_live}
    ORDER BY c.last_activity_at, c.id
    LIMIT %(batch_size)s
    FOR UPDATE SKIP LOCKED
)
SELECT cl.id, k.skipped_locked
FROM (SELECT GREATEST(0, (SELECT count(*) FROM candidates) - (SELECT count(*) FROM claimed))
          AS skipped_locked) k
LEFT JOIN claimed cl ON true
ORDER BY cl.sort_key, cl.id;

-- name: conference_sessions_reap --
-- The whole outcome of claimed conferences (all of a batch, or one in the per-row
-- fallback), in one statement. %(ids)s and %(headers)s are parallel arrays (the event
-- headers carry a per-conference event id computed by the caller).
--   recs:   per conference, its latest non-Failed recording (WasRecorded, RecordingId) and
--           the recordings still running (stop signals after commit), read through
--           ix_recording_session (migration 0010: every recording of the batch's
--           conferences, terminal ones included; before it, a scan of call_recordings);
--   judged: the guard: the row must still be in %(from_status)s; a conference that is
--           to be Ended must not have started after AsOf (its duration would be
--           negative): such a row is rejected (poison), left untouched for the runbook;
--   upd:    the terminal transition (INV-CONF-4), under the status guard; the duration is
--           whole seconds from started_at to AsOf (NULL without started_at, never for
--           Failed); a value that does not fit (e.g. started_at = 0001-01-01) raises and
--           sends the caller to the per-row fallback;
--   ob:     the conference-ended outbox row (only with %(emit_event)s: never for
--           Provisioning -> Failed), idempotent by ConferenceId through ux_outbox_dedupe;
--   rt:     the realtime row for hub-push: reference ids and enums only;
--   healed: a conference reaped after it was poison is forgotten.
-- Returns one row per claimed id: transitioned or rejected, and what the caller logs.
WITH recs AS (
    -- r.id::uuid: an array of a domain over uuid (which the contract accepts) would reach
    -- the driver as text
    SELECT r.session_id,
           (array_agg(r.id::uuid ORDER BY r.created_at DESC, r.id DESC)
                FILTER (WHERE r.status <> 'Failed'))[1] AS recording_id,
           array_agg(r.id::uuid ORDER BY r.created_at, r.id)
               FILTER (WHERE r.status IN ('Pending', 'Recording', 'Uploading'))
               AS active_recordings
    FROM messenger.call_recordings r
    WHERE r.session_kind = 'Conference' AND r.session_id = ANY(%(ids)s::uuid[])
    GROUP BY r.session_id
),
judged AS (
    SELECT c.id, c.chat_id, c.deal_id, c.tenant_id, h.headers,
           CASE
               WHEN c.status <> %(from_status)s::text THEN 'status_changed:' || c.status
               WHEN %(to_status)s::text = 'Ended' AND c.started_at > %(as_of)s
                   THEN 'started_after_as_of'
           END AS rejected,
           rc.recording_id,
           COALESCE(rc.active_recordings, '{}'::uuid[]) AS active_recordings
    FROM unnest(%(ids)s::uuid[], %(headers)s::jsonb[]) AS h(id, headers)
    JOIN messenger.conference_sessions c ON c.id = h.id
    LEFT JOIN recs rc ON rc.session_id = c.id
),
upd AS (
    UPDATE messenger.conference_sessions c
    SET status = %(to_status)s::text, end_reason = %(end_reason)s::text,
        ended_at = %(as_of)s,
        duration_seconds = CASE
            WHEN %(to_status)s::text = 'Ended' AND c.started_at IS NOT NULL
                THEN floor(extract(epoch FROM %(as_of)s - c.started_at))::int
        END,
        updated_at = now()
    FROM judged j
    WHERE c.id = j.id AND j.rejected IS NULL AND c.status = %(from_status)s::text
    -- the columns named, never c.*: the runtime role may read only the contract's
    RETURNING c.id, c.chat_id, c.deal_id, c.tenant_id, c.media_type, c.status,
              c.end_reason, c.started_by_user_id, c.started_at, c.ended_at,
              c.duration_seconds, c.peak_participant_count,
              j.headers, j.recording_id, j.active_recordings
),
ob AS (
    INSERT INTO messenger.integration_outbox
        (topic, message_key, dedupe_key, event_type, payload, headers)
    SELECT %(topic)s::text, u.deal_id::text, u.id::text, 'ConferenceEnded',
           jsonb_build_object(
               'ConferenceId', u.id, 'ChatId', u.chat_id, 'DealId', u.deal_id,
               'TenantId', u.tenant_id, 'MediaType', u.media_type, 'Status', u.status,
               'EndReason', u.end_reason, 'StartedByUserId', u.started_by_user_id,
               'StartedAt', to_char(u.started_at AT TIME ZONE 'UTC',
                                    'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
               'EndedAt', to_char(u.ended_at AT TIME ZONE 'UTC',
                                  'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
               'DurationSeconds', u.duration_seconds,
               'PeakParticipantCount', u.peak_participant_count,
               'Participants', COALESCE((
                   SELECT jsonb_agg(jsonb_build_object(
                              'UserId', p.user_id, 'Role', p.role,
                              'JoinedAt', to_char(p.joined_at AT TIME ZONE 'UTC',
                                                  'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
                              'LeftAt', to_char(p.left_at AT TIME ZONE 'UTC',
                                                'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'))
                          ORDER BY p.joined_at, p.user_id)
                   FROM messenger.conference_participants p
                   WHERE p.conference_id = u.id), '[]'::jsonb),
               'WasRecorded', u.recording_id IS NOT NULL,
               'RecordingId', u.recording_id),
           u.headers
    FROM upd u
    WHERE %(emit_event)s
    ON CONFLICT (topic, dedupe_key) DO NOTHING
    RETURNING dedupe_key
),
rt AS (
    INSERT INTO messenger.realtime_outbox
        (kind, target_kind, chat_id, session_kind, reference_id, payload)
    SELECT %(realtime_kind)s::text, 'ChatGroup', u.chat_id, 'Conference', u.id,
           jsonb_build_object('ConferenceId', u.id, 'Status', u.status,
                              'EndReason', u.end_reason)
    FROM upd u
    RETURNING reference_id
),
healed AS (
    DELETE FROM safetynet.conference_poison p
    USING upd u
    WHERE p.conference_id = u.id
)
SELECT j.id, j.chat_id, j.deal_id, j.tenant_id, j.rejected, u.status, u.end_reason, u.duration_seconds,
       COALESCE(u.active_recordings, '{}'::uuid[]) AS active_recordings,
       ob.dedupe_key IS NOT NULL AS enqueued
FROM judged j
LEFT JOIN upd u ON u.id = j.id
LEFT JOIN ob ON ob.dedupe_key = j.id::text;

-- name: conference_sessions_active_backlog --
-- messenger_conf_reaper_active_backlog: active conferences whose window is exceeded now
-- (on the database clock), whatever the phase. The count is of the rows
-- safetynet.conference_phase (the windows' one definition) puts in a phase; the three
-- branches are only the access path, one index range per phase (the claims' own ranges:
-- ix_conf_empty_room, ix_conf_provisioning, ix_conf_active), so the gauge reads the due
-- conferences and never the live ones (it runs after every reaper cycle).
-- tests/integration/app/test_plan.py checks the count against the function on seeded rows.
SELECT count(*)
FROM (SELECT c.id, c.status, c.active_participant_count, c.last_activity_at, c.created_at
      FROM messenger.conference_sessions c
      WHERE c.status = 'Active' AND c.active_participant_count = 0
        AND c.last_activity_at <= now() - %(empty_room_grace)s * interval '1 second'
      UNION
      SELECT c.id, c.status, c.active_participant_count, c.last_activity_at, c.created_at
      FROM messenger.conference_sessions c
      WHERE c.status = 'Provisioning'
        AND c.created_at <= now() - %(provision_timeout)s * interval '1 second'
      UNION
      SELECT c.id, c.status, c.active_participant_count, c.last_activity_at, c.created_at
      FROM messenger.conference_sessions c
      WHERE c.status = 'Active'
        AND c.last_activity_at <= now() - %(stale_live_timeout)s * interval '1 second'
     ) d
WHERE safetynet.conference_phase(
          d.status, d.active_participant_count, d.last_activity_at, d.created_at,
          now(), %(empty_room_grace)s, %(provision_timeout)s, %(stale_live_timeout)s)
      IS NOT NULL;
