"""Configuration: TOML files merged in order, ``SAFETYNET__SECTION__KEY`` overrides, validation.

>>> cfg = load_config([Path("config/production.example.toml")],
...                   env={"SAFETYNET__POSTGRES__DSN": "postgresql://x"})
>>> cfg.jobs.recording_finalize.batch_size
100

Every setting is a field of a frozen attrs class (:mod:`.sections`, :mod:`.jobs`,
:mod:`.console`) whose metadata carries its documentation, kind and checks
(:mod:`.fields`); cattrs structures the merged TOML into them (:mod:`.loader`),
collecting *every* problem before
failing, one line per problem naming the key; rules across keys come after
(:mod:`.checks`), certificate files follow one policy (:mod:`.certificates`), files are
read bounded (:mod:`.files`). The reference in docs/configuration.md, ``check-config``'s
redacted print, a reload's changed keys and the secrets the logs mask all read the tree
through one walker (:func:`supervision.tree_walk.walk`).
"""

from supervision.config.certificates import ssl_reason
from supervision.config.console import ConsoleConfig, console_problems
from supervision.config.fields import DAY, HOUR, MAX_BATCH, MINUTE
from supervision.config.jobs import (
    AuditConfig,
    ConferenceReaperConfig,
    JobsConfig,
    LeasedJob,
    OutboxRelayConfig,
    RecordingFinalizeConfig,
)
from supervision.config.loader import (
    ENV_CONFIG_FILE,
    ENV_PREFIX,
    EXIT_CONFIG,
    REMOVED_KEYS,
    config_from_dict,
    config_paths,
    load_config,
)
from supervision.config.reference import (
    SettingDoc,
    redacted,
    reference_markdown,
    settings_reference,
)
from supervision.config.sections import (
    Config,
    HttpConfig,
    KafkaConfig,
    LoggingConfig,
    MediaConfig,
    PostgresConfig,
    S3Config,
    SaslMechanism,
    SecurityProtocol,
    SupervisionConfig,
    TracingConfig,
)
from supervision.errors import ConfigError
from supervision.tree_walk import walk

__all__ = [
    "DAY", "ENV_CONFIG_FILE", "ENV_PREFIX", "EXIT_CONFIG", "HOUR", "MAX_BATCH", "MINUTE",
    "REMOVED_KEYS", "AuditConfig", "ConferenceReaperConfig", "Config", "ConfigError",
    "ConsoleConfig", "HttpConfig", "JobsConfig", "KafkaConfig", "LeasedJob", "LoggingConfig",
    "MediaConfig", "OutboxRelayConfig", "PostgresConfig", "RecordingFinalizeConfig",
    "S3Config", "SaslMechanism", "SecurityProtocol", "SettingDoc", "SupervisionConfig",
    "TracingConfig", "config_from_dict", "config_paths", "console_problems", "load_config",
    "redacted", "reference_markdown", "settings_reference", "ssl_reason", "walk",
]
