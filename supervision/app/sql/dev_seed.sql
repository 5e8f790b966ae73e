-- name: dev_seed_recordings --
-- safetynet dev: %(n)s lost-callback recordings of calls that ended two hours ago, each
-- with its Pending finalize row due now. status_of(i) decides Uploading / Available.
WITH sessions AS (
    INSERT INTO messenger.call_sessions (id, chat_id, deal_id, tenant_id, status, started_at,
                                         ended_at, created_at, updated_at)
    SELECT gen_random_uuid(), gen_random_uuid(), gen_random_uuid(), gen_random_uuid(),
           'Ended', now() - interval '3 hours', now() - interval '2 hours',
           now() - interval '3 hours', now()
    FROM generate_series(1, %(n)s)
    RETURNING id, chat_id, deal_id, tenant_id
),
numbered AS (
    SELECT s.*, row_number() OVER (ORDER BY s.id) AS i FROM sessions s
),
recs AS (
    INSERT INTO messenger.call_recordings (id, session_kind, session_id, chat_id, deal_id,
        tenant_id, media_type, trigger, status, file_id, size_bytes, duration_seconds, format,
        started_at, ended_at, available_at, created_at, updated_at)
    SELECT gen_random_uuid(), 'Direct', n.id, n.chat_id, n.deal_id, n.tenant_id,
           CASE WHEN n.i %% 2 = 0 THEN 'Audio' ELSE 'Video' END, 'Auto',
           CASE WHEN n.i <= %(available)s THEN 'Available'
                WHEN n.i %% 3 = 0 THEN 'Recording' ELSE 'Uploading' END,
           NULL, NULL, NULL, NULL,
           now() - interval '3 hours', now() - interval '2 hours',
           CASE WHEN n.i <= %(available)s THEN now() - interval '1 hour' END,
           now() - interval '3 hours', now()
    FROM numbered n
    RETURNING id, session_id, status
),
fixed AS (
    UPDATE messenger.call_recordings r
    SET file_id = 'call-recordings/' || r.id, size_bytes = 4096, duration_seconds = 60,
        format = 'Webm'
    FROM recs WHERE recs.id = r.id AND recs.status = 'Available'
),
attempts AS (
    INSERT INTO messenger.recording_finalize_attempts (id, recording_id, session_kind,
        session_id, next_attempt_at, created_at, updated_at)
    SELECT gen_random_uuid(), recs.id, 'Direct', recs.session_id, now(), now(), now()
    FROM recs
)
SELECT id, status FROM recs ORDER BY id;

-- name: dev_seed_conferences --
-- safetynet dev: orphaned conferences, a third in each reaper phase, with participants.
WITH confs AS (
    INSERT INTO messenger.conference_sessions (id, chat_id, deal_id, tenant_id, media_type,
        status, started_by_user_id, created_at, started_at, last_activity_at,
        active_participant_count, peak_participant_count, updated_at)
    SELECT gen_random_uuid(), gen_random_uuid(), gen_random_uuid(), gen_random_uuid(),
           'Video',
           CASE i %% 3 WHEN 1 THEN 'Provisioning' ELSE 'Active' END,
           gen_random_uuid(), now() - interval '3 hours',
           CASE i %% 3 WHEN 1 THEN NULL ELSE now() - interval '3 hours' END,
           CASE i %% 3 WHEN 0 THEN now() - interval '10 minutes'
                       ELSE now() - interval '2 hours' END,
           CASE i %% 3 WHEN 2 THEN 2 ELSE 0 END, 3, now()
    FROM generate_series(1, %(n)s) AS i
    RETURNING id, started_by_user_id, status
)
INSERT INTO messenger.conference_participants (conference_id, user_id, role, joined_at, left_at)
SELECT c.id, CASE WHEN p = 1 THEN c.started_by_user_id ELSE gen_random_uuid() END,
       CASE WHEN p = 1 THEN 'Host' ELSE 'Participant' END,
       now() - interval '3 hours', CASE WHEN p = 3 THEN now() - interval '2 hours' END
FROM confs c CROSS JOIN generate_series(1, 3) AS p
WHERE c.status = 'Active';

-- name: dev_progress --
SELECT
    (SELECT count(*) FROM messenger.recording_finalize_attempts WHERE status = 'Pending')
        AS finalize_pending,
    (SELECT count(*) FROM messenger.conference_sessions
     WHERE status IN ('Provisioning', 'Active')) AS conferences_active,
    (SELECT count(*) FROM messenger.integration_outbox WHERE published_at IS NULL)
        AS outbox_unpublished;
