-- The messenger's tables as SPEC §2 describes them, for the demo, the tests and the benches
-- ONLY: in production the messenger's own migrations created them and it owns them.
-- Applied on explicit request (`safetynet migrate --messenger-fixture`, or
-- supervision.db.migrate.apply_messenger_fixture), which refuses when any messenger table
-- already exists. Until issue 28 this was migration 0001; safetynet's own migrations
-- never create, alter or drop a messenger table (docs/contract.md).
CREATE SCHEMA IF NOT EXISTS messenger;

CREATE TABLE messenger.call_sessions (
    id uuid PRIMARY KEY,
    chat_id uuid NULL,
    deal_id uuid NULL,
    tenant_id uuid NULL,
    status varchar(16) NOT NULL,
    started_at timestamptz NULL,
    ended_at timestamptz NULL,
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL
);

CREATE TABLE messenger.conference_sessions (
    id uuid PRIMARY KEY,
    chat_id uuid NOT NULL,
    deal_id uuid NOT NULL,
    tenant_id uuid NULL,
    media_type varchar(8) NOT NULL,
    status varchar(16) NOT NULL,
    end_reason varchar(16) NULL,
    started_by_user_id uuid NOT NULL,
    created_at timestamptz NOT NULL,
    started_at timestamptz NULL,
    last_activity_at timestamptz NOT NULL,
    active_participant_count int NOT NULL DEFAULT 0,
    peak_participant_count int NOT NULL DEFAULT 0,
    ended_at timestamptz NULL,
    duration_seconds int NULL,
    updated_at timestamptz NOT NULL
);
CREATE INDEX ix_conf_active ON messenger.conference_sessions (status, last_activity_at)
    WHERE status IN ('Provisioning', 'Active');

CREATE TABLE messenger.conference_participants (
    conference_id uuid NOT NULL REFERENCES messenger.conference_sessions (id),
    user_id uuid NOT NULL,
    role varchar(16) NOT NULL DEFAULT 'Participant',
    joined_at timestamptz NOT NULL,
    left_at timestamptz NULL,
    PRIMARY KEY (conference_id, user_id)
);

CREATE TABLE messenger.call_recordings (
    id uuid PRIMARY KEY,
    session_kind varchar(12) NOT NULL,
    session_id uuid NOT NULL,
    chat_id uuid NULL,
    deal_id uuid NULL,
    tenant_id uuid NULL,
    media_type varchar(8) NOT NULL,
    trigger varchar(16) NOT NULL,
    status varchar(16) NOT NULL,
    file_id text NULL,
    size_bytes bigint NULL,
    duration_seconds int NULL,
    format varchar(8) NULL,
    failure_reason varchar(24) NULL,
    started_at timestamptz NULL,
    ended_at timestamptz NULL,
    available_at timestamptz NULL,
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL
);
CREATE INDEX ix_recording_active ON messenger.call_recordings (session_kind, session_id)
    WHERE status IN ('Pending', 'Recording', 'Uploading');

CREATE TABLE messenger.recording_finalize_attempts (
    id uuid PRIMARY KEY,
    recording_id uuid NOT NULL,
    session_kind varchar(12) NOT NULL,
    session_id uuid NOT NULL,
    status varchar(16) NOT NULL DEFAULT 'Pending',
    attempts int NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    next_attempt_at timestamptz NOT NULL,
    last_error varchar(512) NULL,
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL
);
CREATE UNIQUE INDEX ux_rfa_recording ON messenger.recording_finalize_attempts (recording_id);
CREATE INDEX ix_rfa_due ON messenger.recording_finalize_attempts (status, next_attempt_at);

CREATE TABLE messenger.integration_outbox (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    topic text NOT NULL,
    message_key text NOT NULL,
    dedupe_key text NOT NULL,
    event_type text NOT NULL,
    payload jsonb NOT NULL,
    headers jsonb NOT NULL DEFAULT '{}',
    created_at timestamptz NOT NULL DEFAULT now(),
    published_at timestamptz NULL,
    publish_attempts int NOT NULL DEFAULT 0,
    last_error varchar(512) NULL
);
CREATE UNIQUE INDEX ux_outbox_dedupe ON messenger.integration_outbox (topic, dedupe_key);
CREATE INDEX ix_outbox_unpublished ON messenger.integration_outbox (id)
    WHERE published_at IS NULL;

CREATE TABLE messenger.realtime_outbox (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind varchar(32) NOT NULL,
    target_kind varchar(16) NOT NULL,
    chat_id uuid NULL,
    session_kind varchar(12) NOT NULL,
    reference_id uuid NOT NULL,
    payload jsonb NOT NULL DEFAULT '{}',
    created_at timestamptz NOT NULL DEFAULT now(),
    dispatched_at timestamptz NULL
);
