-- A million-row backlog (issue #15, item 2; docs/benchmarks.md): indexes that keep the
-- gauges and the reaper's claims bounded by what is due, never by the table.
--   ix_rfa_pending_created: the oldest Pending finalize row (the oldest-age gauge) is
--       the first entry, not a scan of the backlog;
--   ix_conf_empty_room: the empty-room claim reads only empty Active rooms, in its
--       (last_activity_at, id) order; through ix_conf_active it read every Active room
--       idle longer than the grace (90 s: nearly all live rooms) to filter on the count;
--   ix_conf_provisioning: the provision-timeout claim reads Provisioning rooms in its
--       (created_at, id) order instead of sorting them all.
CREATE INDEX ix_rfa_pending_created ON messenger.recording_finalize_attempts (created_at)
    WHERE status = 'Pending';
CREATE INDEX ix_conf_empty_room ON messenger.conference_sessions (last_activity_at, id)
    WHERE status = 'Active' AND active_participant_count = 0;
CREATE INDEX ix_conf_provisioning ON messenger.conference_sessions (created_at, id)
    WHERE status = 'Provisioning';
