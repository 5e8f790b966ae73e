-- name: slo_recordings --
-- The seed's recording SLOs, from the small operational table and the partial index:
--   stuck: recordings still Pending/Recording/Uploading although their session ended more
--          than finalize_sla_timeout + polling_interval ago (a session Ended/Failed without
--          ended_at: since it got that status); a recording with no session to wait for
--          (none, an unknown session_kind, an end beyond that horizon in the future)
--          counts once the recording itself is older than the horizon;
--   republish_overdue: Available recordings whose finalize row is still Pending past one
--          polling interval (their event is not enqueued yet).
SELECT
    (SELECT count(*) FROM messenger.call_recordings r
     CROSS JOIN LATERAL (
         SELECT max(x.status) AS status,
                max(COALESCE(x.ended_at, CASE WHEN x.status IN ('Ended', 'Failed')
                                              THEN x.updated_at END)) AS ended_at
         FROM (SELECT cs.status, cs.ended_at, cs.updated_at FROM messenger.call_sessions cs
               WHERE r.session_kind = 'Direct' AND cs.id = r.session_id
               UNION ALL
               SELECT cf.status, cf.ended_at, cf.updated_at
               FROM messenger.conference_sessions cf
               WHERE r.session_kind = 'Conference' AND cf.id = r.session_id) x
     ) e
     WHERE r.status IN ('Pending', 'Recording', 'Uploading')
       AND CASE
               WHEN e.status IS NULL
                    OR e.ended_at > now() + (%(sla)s + %(interval)s) * interval '1 second'
                   THEN r.created_at
               ELSE e.ended_at
           END < now() - (%(sla)s + %(interval)s) * interval '1 second') AS stuck,
    (SELECT count(*) FROM messenger.recording_finalize_attempts a
     JOIN messenger.call_recordings r ON r.id = a.recording_id
     WHERE a.status = 'Pending' AND r.status = 'Available'
       AND a.created_at < now() - %(interval)s * interval '1 second') AS republish_overdue,
    (SELECT count(*) FROM messenger.recording_finalize_attempts
     WHERE status = 'Quarantined') AS quarantined;
