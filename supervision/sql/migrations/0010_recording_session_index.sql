-- The reaper's recordings of a batch of conferences (issue #15: cost independent of the
-- tables' history; docs/benchmarks.md). conference_sessions_reap reads every recording of
-- each reaped conference, terminal ones included (WasRecorded, RecordingId): only running
-- recordings are in ix_recording_active, so each batch read call_recordings whole, a cost
-- that grows with every recording ever made. IF NOT EXISTS: on a large table an operator
-- may build it first with CREATE INDEX CONCURRENTLY (docs/operations.md).
CREATE INDEX IF NOT EXISTS ix_recording_session
    ON messenger.call_recordings (session_kind, session_id);
