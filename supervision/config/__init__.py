"""Configuration, the framework: TOML files merged in order, ``SAFETYNET__SECTION__KEY``
overrides, validation; and the sections of the runtime and its services.

>>> cfg = load_config(Config, [Path("config/production.example.toml")],
...                   env={"SAFETYNET__POSTGRES__DSN": "postgresql://x"})
>>> cfg.postgres.statement_timeout
20.0

Every setting is a field of a frozen attrs class (:mod:`.sections`, :mod:`.console`, a
job's ``actors/<job>/settings.py``) whose metadata carries its documentation, kind and
checks (:mod:`.fields`); the jobs run under a lease share one block (:mod:`.leased`).
cattrs structures the merged TOML into a root class (:mod:`.loader`), collecting *every*
problem before failing, one line per problem naming the key; rules across keys come after
(:mod:`.checks`: generic, they find leases and sections' own rules by walking the tree),
certificate files follow one policy (:mod:`.certificates`), files are read bounded
(:mod:`.files`). The reference in docs/configuration.md, ``check-config``'s redacted
print, a reload's changed keys and the secrets the logs mask all read the tree through one
walker (:func:`supervision.tree_walk.walk`).

The root (``Config``: these sections and the jobs') is the composition root's
(:mod:`supervision.app.settings`): the runtime may not import the actors that own the
jobs' sections.
"""

from supervision.config.certificates import ssl_reason
from supervision.config.console import ConsoleConfig, console_problems, console_warnings
from supervision.config.fields import DAY, HOUR, MAX_BATCH, MINUTE
from supervision.config.leased import (
    Leased,
    LeasedJob,
    lock_ttl_setting,
    max_run_duration_setting,
    polling_interval_setting,
)
from supervision.config.loader import (
    ENV_CONFIG_FILE,
    ENV_PREFIX,
    EXIT_CONFIG,
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
    Acks,
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
    "Acks", "ConfigError", "ConsoleConfig", "HttpConfig", "KafkaConfig", "Leased", "LeasedJob",
    "LoggingConfig", "MediaConfig", "PostgresConfig", "S3Config", "SaslMechanism",
    "SecurityProtocol", "SettingDoc", "SupervisionConfig", "TracingConfig",
    "config_from_dict", "config_paths", "console_problems", "console_warnings", "load_config",
    "lock_ttl_setting", "max_run_duration_setting", "polling_interval_setting", "redacted",
    "reference_markdown", "settings_reference", "ssl_reason", "walk",
]
