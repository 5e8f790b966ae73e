"""The sections of the runtime and its services: one frozen attrs class per TOML table,
and the root :class:`Config` that holds them and the jobs' sections (:mod:`.jobs`).

>>> Config(postgres=PostgresConfig(dsn=Secret("postgresql://app@127.0.0.1/messenger")))

Every setting is a field made by :func:`~supervision.config.fields.setting`: its metadata
carries the documentation, the kind of value (duration) and its checks, so the loader,
the docs/configuration.md reference and ``check-config`` all come from this one place.
"""

from __future__ import annotations

import enum
import ssl

import attrs

from supervision.config.certificates import (
    ca_file,
    key_file_problem,
    media_ca_file,
    no_passphrase,
    readable_file,
)
from supervision.config.console import ConsoleConfig
from supervision.config.fields import DAY, HOUR, MINUTE, non_negative, one_of, positive, setting
from supervision.config.jobs import AuditConfig, JobsConfig, OutboxRelayConfig
from supervision.config.values import bootstrap, dsn, host_port, http_url, tracing_url
from supervision.secrets import Secret


@attrs.frozen
class PostgresConfig:
    dsn: Secret = setting(
        doc="libpq DSN of the messenger database. Must be a direct connection (advisory "
        "locks are session-level; a transaction-mode pooler breaks single-runner). A host "
        "that is not loopback or a Unix socket needs sslmode=verify-full. Secret.",
        checks=[dsn],
    )
    statement_timeout: float = setting(
        20.0, "Server-side bound of one statement (libpq `options=-c statement_timeout`); "
        "the client gives up on a statement unanswered for statement_timeout + min(5s, "
        "statement_timeout) and closes that connection (a stopped backend never answers). "
        "Must be below every job's lock_ttl (the defaults fit a lock_ttl of 30s).",
        duration=True, checks=[positive], maximum=HOUR,
    )
    lock_timeout: float = setting(
        5.0, "Longest wait for a row or table lock another session holds; then the "
        "statement fails fast and its work is tried again in a later cycle. Must not exceed "
        "statement_timeout.",
        duration=True, checks=[positive], maximum=10 * MINUTE,
    )
    idle_in_transaction_session_timeout: float = setting(
        25.0, "The server ends a session idle inside a transaction this long (a frozen "
        "daemon releases its row locks). Must be below every job's lock_ttl.",
        duration=True, checks=[positive], maximum=HOUR,
    )
    connect_timeout: float = setting(
        5.0, "Bound of opening one connection (libpq `connect_timeout`, whole seconds, "
        "rounded up; libpq treats 1 as 2).",
        duration=True, checks=[positive], maximum=2 * MINUTE,
    )


class SecurityProtocol(enum.StrEnum):
    """How the Kafka client talks to the brokers (Kafka's ``security.protocol``)."""

    PLAINTEXT = "PLAINTEXT"
    SSL = "SSL"
    SASL_PLAINTEXT = "SASL_PLAINTEXT"
    SASL_SSL = "SASL_SSL"

    @property
    def uses_tls(self) -> bool:
        return self in (SecurityProtocol.SSL, SecurityProtocol.SASL_SSL)

    @property
    def uses_sasl(self) -> bool:
        return self in (SecurityProtocol.SASL_PLAINTEXT, SecurityProtocol.SASL_SSL)


class SaslMechanism(enum.StrEnum):
    """The SASL mechanism of a ``SASL_*`` protocol."""

    PLAIN = "PLAIN"
    SCRAM_SHA_256 = "SCRAM-SHA-256"
    SCRAM_SHA_512 = "SCRAM-SHA-512"


@attrs.frozen
class KafkaConfig:
    bootstrap_servers: str = setting(
        "127.0.0.1:9092", "Comma-separated HOST:PORT list of Kafka brokers.", checks=[bootstrap]
    )
    client_id: str = setting("safetynet", "Kafka client id.")
    security_protocol: SecurityProtocol = setting(
        SecurityProtocol.PLAINTEXT, "PLAINTEXT, SSL (TLS), SASL_PLAINTEXT or SASL_SSL (SASL "
        "over TLS). A broker certificate the CA does not vouch for, or credentials the "
        "broker rejects, are a configuration fault (readiness 503), never a crash loop.",
    )
    sasl_mechanism: SaslMechanism = setting(
        SaslMechanism.SCRAM_SHA_512, "PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (SASL_* "
        "protocols only). PLAIN sends the password itself: only over SASL_SSL (refused "
        "over SASL_PLAINTEXT whatever the broker).",
    )
    sasl_username: str = setting("", "SASL user name; required by the SASL_* protocols.")
    sasl_password: Secret = setting(
        Secret(""), "SASL password; required by the SASL_* protocols. Secret (pass it as "
        "SAFETYNET__KAFKA__SASL_PASSWORD).",
    )
    ssl_cafile: str = setting(
        "", "PEM file of the CA(s) that sign the brokers' certificates (SSL/SASL_SSL); "
        "empty = the system's trust store. The broker's host name is always verified.",
        checks=[readable_file],
    )
    ssl_certfile: str = setting(
        "", "PEM client certificate for mutual TLS; empty = none. Needs ssl_keyfile.",
        checks=[readable_file],
    )
    ssl_keyfile: str = setting(
        "", "PEM private key (unencrypted) of ssl_certfile; empty = none. Refused when "
        "its group or others may read or write it (chmod 600 or 400).",
        checks=[readable_file, key_file_problem],
    )

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context of the SSL/SASL_SSL protocols (None for the others), built by
        aiokafka's helper; raises :class:`ssl.SSLError`/:class:`OSError` for files that
        do not hold what they should."""
        from aiokafka.helpers import create_ssl_context

        if not self.security_protocol.uses_tls:
            return None
        context: ssl.SSLContext = create_ssl_context(
            cafile=self.ssl_cafile or None, certfile=self.ssl_certfile or None,
            keyfile=self.ssl_keyfile or None, password=no_passphrase)
        return context


@attrs.frozen
class S3Config:
    endpoint_url: str = setting(
        "http://127.0.0.1:8333", "S3-compatible endpoint URL.", checks=[http_url]
    )
    region: str = setting("us-east-1", "Region used for SigV4 signing.")
    bucket: str = setting("call-recordings", "Bucket of the CALL_RECORDINGS category.")
    key_prefix: str = setting(
        "call-recordings/", "Object key prefix; a recording is {key_prefix}{recording_id}."
    )
    access_key_id: Secret = setting(
        Secret(""), "Static S3 access key id; set it together with secret_access_key, or "
        "leave both empty to take the credentials from botocore's chain (AWS_* variables, "
        "web identity, shared credentials file, container or instance metadata; see "
        "docs/operations.md, S3 credentials). Secret.")
    secret_access_key: Secret = setting(
        Secret(""), "Static S3 secret access key (with access_key_id). Secret.")
    profile: str = setting(
        "", "Profile of the shared AWS config/credentials files the chain reads; empty = "
        "AWS_PROFILE, else `default`. Naming one skips the AWS_ACCESS_KEY_ID variables.")
    addressing_style: str = setting(
        "path", "path (endpoint/bucket/key) or virtual (bucket.endpoint/key, "
        "virtual-hosted style).", checks=[one_of("path", "virtual")])
    ca_file: str = setting(
        "", "PEM file of the CA(s) that sign the S3 endpoint's certificate (a private CA); "
        "empty = the certifi bundle. A certificate it does not trust is a configuration "
        "fault.", checks=[ca_file])
    timeout: float = setting(5.0, "Timeout of one S3 request.", duration=True, checks=[positive],
                              maximum=5 * MINUTE)
    concurrency: int = setting(
        8, "Size of the S3 reconciler pool: HEAD requests on the wire at once (one"
        " connection each; the pool queues 2 per connection in the S3 worker). At most 256:"
        " the worker waits on its sockets with select(), which stops at 1,024 descriptors.",
        checks=[positive], maximum=256)


@attrs.frozen
class MediaConfig:
    base_url: str = setting(
        "http://127.0.0.1:8090", "Media stack base URL (recorder stop signal).", checks=[http_url]
    )
    token: Secret = setting(
        Secret(""), "Bearer token for the media stack; empty = none. Sent only over https://"
        " unless the host is loopback. Secret.")
    ca_file: str = setting(
        "", "PEM bundle of the CA(s) that sign the media stack's certificate (a private CA);"
        " empty = the public CAs of certifi. Checked when the configuration is loaded, like"
        " every certificate file: exit 78 (a reload is refused) when it cannot be loaded.",
        checks=[media_ca_file])
    timeout: float = setting(
        2.0, "Timeout of one recorder stop request.", duration=True, checks=[positive],
        maximum=MINUTE,
    )


@attrs.frozen
class HttpConfig:
    listen: str = setting(
        "127.0.0.1:9464", "HOST:PORT of /metrics, /healthz, /readyz (loopback by default).",
        checks=[host_port],
    )


@attrs.frozen
class LoggingConfig:
    level: str = setting(
        "info", "Log level.", checks=[one_of("debug", "info", "warning", "error")]
    )
    format: str = setting("json", "json (one object per line) or console.",
                           checks=[one_of("json", "console")])


@attrs.frozen
class SupervisionConfig:
    max_restarts: int = setting(
        5, "Restarts allowed per actor within restart_window before escalating.",
        checks=[non_negative], maximum=1000,
    )
    restart_window: float = setting(
        60.0, "Window of the restart intensity.", duration=True, checks=[positive], maximum=DAY
    )
    shutdown_grace: float = setting(
        10.0, "Time in-flight work gets to commit or roll back on SIGTERM.", duration=True,
        checks=[positive], maximum=10 * MINUTE,
    )


@attrs.frozen
class TracingConfig:
    endpoint: str = setting(
        "", "OTLP/HTTP traces endpoint; empty = tracing off. Its query string and "
        "userinfo (an `?api_key=`) are masked in check-config and in every log line.",
        checks=[tracing_url])


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
