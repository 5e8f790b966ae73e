-- The invariant auditor's indexes (issue #18: `safetynet audit` and the auditor actor).
-- Each audit run judges a bounded window of recent rows, never a whole table: recordings
-- and conferences that became terminal lately (by updated_at), outbox rows written lately
-- (by created_at), and each one's realtime rows (by reference_id). Without these four the
-- window would be a sequential scan of the largest tables. The two partial ones cover only
-- terminal rows; all four are append-ordered and cheap to maintain.
CREATE INDEX ix_recording_terminal_updated ON messenger.call_recordings (updated_at)
    WHERE status IN ('Available', 'Failed');
CREATE INDEX ix_conf_terminal_updated ON messenger.conference_sessions (updated_at)
    WHERE status IN ('Ended', 'Failed');
CREATE INDEX ix_outbox_created ON messenger.integration_outbox (created_at);
CREATE INDEX ix_realtime_reference ON messenger.realtime_outbox (reference_id);
