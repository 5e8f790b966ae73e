"""The configuration's root: the runtime's sections and each job's, as one TOML file.

>>> cfg = load_config([Path("config/production.example.toml")],
...                   env={"SAFETYNET__POSTGRES__DSN": "postgresql://x"})
>>> cfg.jobs.recording_finalize.batch_size
100

The composition root is the one place that knows both the runtime's sections
(:mod:`supervision.config.sections`) and the jobs' (``actors/<job>/settings.py``), so the
root :class:`Config` is assembled here and the framework's loader, checks and reference
(:mod:`supervision.config`) are bound to it. Importing this module imports the jobs'
settings modules only (attrs and the config framework), never an actor: the
configuration is loaded and checked (exit 78) before any actor is imported. Every rule
across keys reads one section, or finds what it needs by walking the tree (the
PostgreSQL timeouts below every lease's TTL), so none is written here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from actors.audit.settings import AuditConfig
from actors.finalize.settings import RecordingFinalizeConfig
from actors.outbox.settings import OutboxRelayConfig
from actors.reaper.settings import ConferenceReaperConfig
from supervision.config import loader, reference
from supervision.config.console import ConsoleConfig
from supervision.config.sections import (
    HttpConfig,
    KafkaConfig,
    LoggingConfig,
    MediaConfig,
    PostgresConfig,
    S3Config,
    SupervisionConfig,
    TracingConfig,
)


@attrs.frozen
class JobsConfig:
    recording_finalize: RecordingFinalizeConfig = attrs.field(factory=RecordingFinalizeConfig)
    conference_reaper: ConferenceReaperConfig = attrs.field(factory=ConferenceReaperConfig)


@attrs.frozen
class Config:
    postgres: PostgresConfig
    kafka: KafkaConfig = attrs.field(factory=KafkaConfig)
    s3: S3Config = attrs.field(factory=S3Config)
    media: MediaConfig = attrs.field(factory=MediaConfig)
    jobs: JobsConfig = attrs.field(factory=JobsConfig)
    outbox_relay: OutboxRelayConfig = attrs.field(factory=OutboxRelayConfig)
    audit: AuditConfig = attrs.field(factory=AuditConfig)
    http: HttpConfig = attrs.field(factory=HttpConfig)
    logging: LoggingConfig = attrs.field(factory=LoggingConfig)
    supervision: SupervisionConfig = attrs.field(factory=SupervisionConfig)
    tracing: TracingConfig = attrs.field(factory=TracingConfig)
    console: ConsoleConfig = attrs.field(factory=ConsoleConfig)  # `safetynet console`


def load_config(paths: Sequence[Path], env: Mapping[str, str] | None = None) -> Config:
    """Merge *paths* in order, apply env overrides, validate; raise
    :class:`~supervision.errors.ConfigError`."""
    return loader.load_config(Config, paths, env)


def config_from_dict(raw: Mapping[str, Any]) -> Config:
    """Validate already-merged settings (a TOML-shaped mapping); raise
    :class:`~supervision.errors.ConfigError`."""
    return loader.config_from_dict(Config, raw)


def reference_markdown() -> str:
    """The configuration reference table, as it stands in docs/configuration.md."""
    return reference.reference_markdown(Config)
