"""The sections of the configuration: one frozen attrs class per TOML table.

>>> Config(postgres=PostgresConfig(dsn=Secret("postgresql://app@127.0.0.1/messenger")))

Every setting is a field made by :func:`~supervision.config.fields.setting`: its metadata
carries the documentation, the kind of value (duration) and its checks, so the loader,
the docs/configuration.md reference and ``check-config`` all come from this one place.
The jobs run under a lease share one block (:class:`LeasedJob`): ``polling_interval``,
``lock_ttl`` and ``max_run_duration`` are declared once, below, with their docs, bounds
and the rule that binds them (the lease outlives the longest cycle); each job gives only
its defaults, and its TOML keys stay flat (``jobs.recording_finalize.lock_ttl``).
"""

from __future__ import annotations

import enum
import ssl
from collections.abc import Iterator
from typing import Any

import attrs

from supervision.config.certificates import (
    ca_file,
    key_file_problem,
    media_ca_file,
    no_passphrase,
    readable_file,
)
from supervision.config.console import ConsoleConfig
from supervision.config.fields import (
    DAY,
    HOUR,
    MAX_BATCH,
    MINUTE,
    at_least_one,
    fraction,
    non_negative,
    one_of,
    positive,
    setting,
)
from supervision.config.values import bootstrap, dsn, host_port, http_url, tracing_url
from supervision.durations import format_duration
from supervision.secrets import Secret

# --------------------------------------------------------------------------- leased jobs


def polling_interval_setting(default: float) -> Any:
    """A leased job's ``polling_interval`` setting, with the job's *default*."""
    return setting(default, "Time between cycle starts.", duration=True, checks=[positive],
                   maximum=HOUR)


def lock_ttl_setting(default: float) -> Any:
    """A leased job's ``lock_ttl`` setting, with the job's *default*."""
    return setting(
        default, "TTL of the job's lease and bound of one cycle; must exceed "
        "max_run_duration. The lease is renewed every lock_ttl/4 while a cycle runs: a "
        "frozen leader is replaced this long after its last renewal (plus one "
        "polling_interval).", duration=True, checks=[positive], maximum=2 * HOUR)


def max_run_duration_setting(default: float) -> Any:
    """A leased job's ``max_run_duration`` setting, with the job's *default*."""
    return setting(default, "A cycle stops claiming after this long.", duration=True,
                   checks=[positive], maximum=HOUR)


class LeasedJob:
    """A job that runs in cycles under a lease (the lock keeper): its section declares
    ``polling_interval = polling_interval_setting(...)``, ``lock_ttl =
    lock_ttl_setting(...)`` and ``max_run_duration = max_run_duration_setting(...)``.
    Adds no field of its own."""

    __slots__ = ()

    polling_interval: float
    lock_ttl: float
    max_run_duration: float

    def lease_problems(self, key: str) -> Iterator[str]:
        """What is wrong with the block as a whole (*key*: the section's dotted key)."""
        if self.lock_ttl <= self.max_run_duration:
            yield (f"{key}.lock_ttl: must be greater than max_run_duration "
                   f"({format_duration(self.max_run_duration)}), got "
                   f"{format_duration(self.lock_ttl)}")


# --------------------------------------------------------------------------- sections


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
class RecordingFinalizeConfig(LeasedJob):
    enabled: bool = setting(True, "Run the job (RECORDINGS_ENABLED).")
    polling_interval: float = polling_interval_setting(60.0)
    batch_size: int = setting(100, "Rows claimed per batch (exactly). At high `s3.concurrency` "
                               "keep it >= 4 x `s3.concurrency` (two reconciler pools), or "
                               "the claims cannot keep every connection busy.",
                               checks=[positive],
                               maximum=MAX_BATCH)
    max_attempts: int = setting(8, "Attempts before a row is quarantined.", checks=[positive],
                                 maximum=100)
    finalize_sla_timeout: float = setting(
        1800.0, "How long after its session ended a recording is reconciled.", duration=True,
        checks=[non_negative], maximum=7 * DAY,
    )
    backoff_base: float = setting(60.0, "First retry delay.", duration=True, checks=[positive],
                                   maximum=DAY)
    backoff_factor: float = setting(
        2.0, "Growth factor of the retry delay.", checks=[at_least_one], maximum=10.0
    )
    backoff_cap: float = setting(900.0, "Largest retry delay.", duration=True, checks=[positive],
                                  maximum=7 * DAY)
    backoff_jitter: float = setting(
        0.2, "Random +/- fraction applied to each delay.", checks=[fraction], maximum=0.9
    )
    lock_ttl: float = lock_ttl_setting(300.0)
    max_run_duration: float = max_run_duration_setting(180.0)
    redrive_after: float = setting(
        900.0, "Self-healing quarantine: rows quarantined for an object-storage failure "
        "(last_error s3:*) are requeued once S3 has been healthy this long (every cycle's "
        "probe green, its breaker closed, no transient HEAD), batch_size per cycle.",
        duration=True, checks=[non_negative], maximum=7 * DAY,
    )
    redrive_max: int = setting(
        3, "How many times one row is requeued by itself; past it, it waits for "
        "`safetynet requeue`. 0 turns the self-healing off.",
        checks=[non_negative], maximum=100,
    )


@attrs.frozen
class ConferenceReaperConfig(LeasedJob):
    enabled: bool = setting(True, "Run the job (CONFERENCE_CALLS_ENABLED).")
    polling_interval: float = polling_interval_setting(30.0)
    batch_size: int = setting(100, "Conferences claimed per phase and cycle.", checks=[positive],
                               maximum=MAX_BATCH)
    empty_room_grace: float = setting(
        90.0, "An Active room with nobody in it is ended after this long.", duration=True,
        checks=[positive], maximum=DAY,
    )
    provision_timeout: float = setting(
        120.0, "A Provisioning conference fails after this long.", duration=True,
        checks=[positive], maximum=DAY,
    )
    stale_live_timeout: float = setting(
        14400.0, "An Active conference with no activity is ended after this long.",
        duration=True, checks=[positive], maximum=30 * DAY,
    )
    lock_ttl: float = lock_ttl_setting(120.0)
    max_run_duration: float = max_run_duration_setting(30.0)
    poison_backoff_cap: float = setting(
        3600.0, "A poison conference (its outcome cannot be written, or it started after "
        "AsOf) is out of the claim for polling_interval x 2^failures, at most this long.",
        duration=True, checks=[positive], maximum=7 * DAY,
    )


@attrs.frozen
class JobsConfig:
    recording_finalize: RecordingFinalizeConfig = attrs.field(factory=RecordingFinalizeConfig)
    conference_reaper: ConferenceReaperConfig = attrs.field(factory=ConferenceReaperConfig)


@attrs.frozen
class OutboxRelayConfig:
    enabled: bool = setting(True, "Run the Kafka outbox relay.")
    batch_size: int = setting(500, "Outbox rows claimed per batch.", checks=[positive],
                               maximum=MAX_BATCH)
    poll_interval: float = setting(
        1.0, "Fallback poll period; LISTEN/NOTIFY wakes the relay sooner.", duration=True,
        checks=[positive], maximum=5 * MINUTE,
    )
    retention: float = setting(
        604800.0, "Published rows older than this are deleted.", duration=True,
        checks=[positive], maximum=365 * DAY,
    )
    retention_enabled: bool = setting(
        True, "Delete published rows older than retention (through the ix_outbox_published "
        "index); false when the messenger owns its outbox's retention.")
    wakeup: str = setting(
        "notify", "How relays learn of new outbox rows: `notify` (`safetynet migrate` "
        "installs a statement-level NOTIFY trigger on messenger.integration_outbox, polling "
        "stays the fallback) or `poll` (no trigger on the messenger's table: migrate drops "
        "it; rows wait up to poll_interval).", checks=[one_of("notify", "poll")])
    lock_ttl: float = setting(
        60.0, "TTL of the relay's lease (renewed every lock_ttl/4 while a cycle runs; a "
        "frozen leader is replaced this long after its last renewal). A relay cycle runs "
        "at most half of it.", duration=True, checks=[positive], maximum=DAY,
    )
    claim_max_bytes: int = setting(
        16 * 1024 * 1024, "Bytes of outbox rows (payload, headers, key) one claim fetches at "
        "most; a claim stops before the row that would pass it (its first row always comes). "
        "The relay holds about two claims, so its memory stays bounded whatever the rows "
        "hold. A row larger than the producer's max request size (1 MiB) is dead-lettered "
        "without its payload being fetched.", checks=[positive], maximum=1024 * 1024 * 1024,
    )
    dead_letter_retention: float = setting(
        2592000.0, "Dead letters older than this are deleted together with their outbox "
        "row, unless one still blocks later rows of its key (`safetynet replay` puts one "
        "back instead).", duration=True, checks=[positive], maximum=365 * DAY,
    )
    notify_min_interval: float = setting(
        0.05, "Shortest time between two relay wake-ups from NOTIFY safetynet_outbox; "
        "notifications in between are coalesced into one wake-up at its end (any login may "
        "NOTIFY).", duration=True, checks=[non_negative], maximum=MINUTE,
    )


@attrs.frozen
class AuditConfig:
    enabled: bool = setting(True, "Run the auditor actor in `safetynet run` (the SQL-only "
                             "invariants of `safetynet audit`, every interval).")
    interval: float = setting(
        300.0, "Time between the auditor actor's runs.", duration=True, checks=[positive],
        maximum=DAY,
    )
    window: float = setting(
        900.0, "How far back the auditor actor looks at terminal transitions and outbox "
        "rows (`safetynet audit --since` overrides it); at least interval + grace, so every "
        "transition is judged by one run. Never further than outbox_relay.retention: "
        "pruned outbox rows are not violations. A run's cost grows with the rows inside it.",
        duration=True, checks=[positive], maximum=365 * DAY,
    )
    grace: float = setting(
        300.0, "A transition younger than this is not judged yet (an Available recording "
        "is republished within a polling interval).", duration=True,
        checks=[non_negative], maximum=DAY,
    )
    relay_lag: float = setting(
        300.0, "An unpublished outbox row younger than this is not a violation.",
        duration=True, checks=[non_negative], maximum=DAY,
    )
    max_violations: int = setting(
        1000, "Violations reported per invariant and run at most (the gauge saturates here).",
        checks=[positive], maximum=100_000,
    )
    s3_sample: int = setting(
        50, "`safetynet audit`: Failed recordings HEADed at most per run (failed_with_object).",
        checks=[non_negative], maximum=10_000,
    )
    s3_rate: float = setting(
        10.0, "`safetynet audit`: HEAD requests per second at most.", checks=[positive],
        maximum=1000.0,
    )
    kafka_max_messages: int = setting(
        100_000, "`safetynet audit --kafka`: messages read at most; a window holding more "
        "cannot be judged (exit 1).", checks=[positive], maximum=500_000,
    )
    kafka_timeout: float = setting(
        30.0, "`safetynet audit --kafka`: bound of the whole topic read.", duration=True,
        checks=[positive], maximum=HOUR,
    )
    kafka_max_bytes: int = setting(
        256 * 1024 * 1024, "`safetynet audit --kafka`: bytes of messages (keys, values, "
        "headers) read at most; a window holding more cannot be judged (exit 1).",
        checks=[positive], maximum=4 * 1024 * 1024 * 1024,
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
