-- name: slo_recordings --
-- The seed's recording SLOs, from the small operational table and the partial index:
--   stuck: recordings still Pending/Recording/Uploading although their session ended more
--          than finalize_sla_timeout + polling_interval ago (a session Ended/Failed without
--          ended_at: since it got that status); a recording with no session to wait for
--          (none, an unknown session_kind, an end beyond that horizon in the future)
--          counts once the recording itself is older than the horizon;
--   republish_overdue: Available recordings whose finalize row is still Pending past one
--          polling interval (their event is not enqueued yet).
--   quarantined: finalize rows in quarantine.
-- Every figure is bounded whatever the backlog (docs/benchmarks.md, a million rows):
--   stuck counts up to 1,000 (a value of 1,000 reads ">= 1,000"; each costs a session
--          probe); its scan walks ix_recording_active and stops at the 1,000th stuck
--          recording, so beyond the stuck ones it reads only the recordings not yet past
--          the SLO (live calls, calls ended less than the SLA ago): traffic, not backlog;
--   quarantined counts up to 10,000 (index-only on ix_rfa_due);
--   republish_overdue is exact over two windows of 1,000 rows each and a lower bound
--          beyond them: the first Pending rows in queue order (ix_rfa_due) and the
--          recordings that became terminal last (ix_recording_terminal_updated, where the
--          ingest callback's Available recordings with a missing event are). Which
--          Pending rows have an Available recording is in no single index; an exact
--          count would read the whole backlog or every terminal recording.
SELECT
    (SELECT count(*) FROM (
        SELECT 1 FROM messenger.call_recordings r
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
              END < now() - (%(sla)s + %(interval)s) * interval '1 second'
        ORDER BY r.session_kind, r.session_id  -- ix_recording_active order: an index path
        LIMIT 1000) s) AS stuck,
    (SELECT count(*) FROM (
        SELECT h.id
        FROM (SELECT a.id, a.recording_id, a.created_at
              FROM messenger.recording_finalize_attempts a
              WHERE a.status = 'Pending'
              ORDER BY a.next_attempt_at
              LIMIT 1000) h
        -- each recording by its key (lateral): joined, the planner walked every terminal
        -- recording through ix_recording_terminal_updated (0.2 s at 100,000)
        CROSS JOIN LATERAL (SELECT r.status FROM messenger.call_recordings r
                            WHERE r.id = h.recording_id LIMIT 1) r
        WHERE r.status = 'Available'
          AND h.created_at < now() - %(interval)s * interval '1 second'
        UNION
        SELECT a.id
        FROM (SELECT r.id, r.status
              FROM messenger.call_recordings r
              WHERE r.status IN ('Available', 'Failed')
              ORDER BY r.updated_at DESC
              LIMIT 1000) t
        JOIN messenger.recording_finalize_attempts a ON a.recording_id = t.id
        WHERE t.status = 'Available' AND a.status = 'Pending'
          AND a.created_at < now() - %(interval)s * interval '1 second') w
    ) AS republish_overdue,
    (SELECT count(*) FROM (SELECT 1 FROM messenger.recording_finalize_attempts
                           WHERE status = 'Quarantined'
                           ORDER BY next_attempt_at  -- ix_rfa_due, index-only
                           LIMIT 10000) q) AS quarantined;
