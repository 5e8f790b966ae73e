-- Self-healing quarantine and runtime control (issue #18), kept in the safetynet schema:
-- the messenger schema holds exactly SPEC §2. No foreign key into messenger: the
-- messenger service must stay free to delete its rows.

-- How often recording-finalize has requeued a quarantined row by itself ("redrive"): only
-- rows quarantined for a dependency's failure (last_error s3:*) once that dependency has
-- been healthy for jobs.recording_finalize.redrive_after, at most redrive_max times per
-- row. `safetynet requeue` (a person acting) forgets the count; rows Done or gone are
-- pruned by the redrive itself.
CREATE TABLE safetynet.finalize_redrives (
    attempt_id uuid PRIMARY KEY,
    recording_id uuid NOT NULL,
    redrives int NOT NULL CHECK (redrives > 0),
    last_reason varchar(512) NOT NULL,
    last_redriven_at timestamptz NOT NULL
);

-- What the cycles observed of a dependency (one row per dependency: 's3'): since when it
-- has been healthy without a break (NULL while it is not), and when it was last observed.
-- Every cycle writes it under its lease, so every replica sees one history.
CREATE TABLE safetynet.dependency_health (
    dependency varchar(64) PRIMARY KEY,
    healthy_since timestamptz NULL,
    observed_at timestamptz NOT NULL
);

-- Paused jobs (`safetynet pause --job J`): every replica's lock keeper reads this row
-- right before it would take the job's lease, and skips the cycle (no lease) while the
-- row exists. `safetynet resume` deletes it.
CREATE TABLE safetynet.job_pauses (
    job varchar(64) PRIMARY KEY,
    reason varchar(512) NULL,
    paused_at timestamptz NOT NULL,
    paused_by varchar(256) NOT NULL
);
