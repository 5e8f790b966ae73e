-- name: slo_recordings --
-- The seed's recording SLOs, from the small operational table and the partial index:
--   stuck: recordings still Recording/Uploading although their session ended more than
--          finalize_sla_timeout + polling_interval ago;
--   republish_overdue: Available recordings whose finalize row is still Pending past one
--          polling interval (their event is not enqueued yet).
SELECT
    (SELECT count(*) FROM messenger.call_recordings r
     LEFT JOIN messenger.call_sessions cs
            ON r.session_kind = 'Direct' AND cs.id = r.session_id
     LEFT JOIN messenger.conference_sessions cf
            ON r.session_kind = 'Conference' AND cf.id = r.session_id
     WHERE r.status IN ('Pending', 'Recording', 'Uploading')
       AND COALESCE(cs.ended_at, cf.ended_at)
           < now() - (%(sla)s + %(interval)s) * interval '1 second') AS stuck,
    (SELECT count(*) FROM messenger.recording_finalize_attempts a
     JOIN messenger.call_recordings r ON r.id = a.recording_id
     WHERE a.status = 'Pending' AND r.status = 'Available'
       AND a.created_at < now() - %(interval)s * interval '1 second') AS republish_overdue,
    (SELECT count(*) FROM messenger.recording_finalize_attempts
     WHERE status = 'Quarantined') AS quarantined;
