"""Configuration: TOML files merged in order, ``SAFETYNET__SECTION__KEY`` overrides, validation.

>>> cfg = load_config([Path("config/production.example.toml")],
...                   env={"SAFETYNET__POSTGRES__DSN": "postgresql://x"})
>>> cfg.jobs.recording_finalize.batch_size
100

Every setting is a field of a frozen attrs class below; its metadata carries the
documentation, the kind of value (duration, secret) and its checks, so the loader, the
docs/configuration.md reference and ``check-config`` are all generated from this one place. Loading
collects *every* problem before failing, one line per problem naming the key.
"""

from __future__ import annotations

import difflib
import enum
import ipaddress
import math
import os
import ssl
import tomllib
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import attrs

from supervision.config_checks import (
    bounded_repr,
    dsn_transport_problem,
    guarded_problem,
    key_file_problem,
    tracing_url,
)
from supervision.config_files import (
    UnreadableFile,
    deep_nesting_key,
    read_config_text,
    regular_file_problem,
)
from supervision.console_config import ConsoleConfig
from supervision.durations import format_duration, parse_duration
from supervision.errors import ConfigError
from supervision.secrets import (
    REDACTED,
    InvalidDsn,
    Secret,
    parse_dsn,
    redact_dsn,
    redact_url,
)

ENV_PREFIX = "SAFETYNET__"
ENV_CONFIG_FILE = "SAFETYNET_CONFIG"
EXIT_CONFIG = 78  # EX_CONFIG from sysexits.h

Check = Callable[[Any], str | None]
_REQUIRED = attrs.NOTHING
MINUTE, HOUR, DAY = 60.0, 3600.0, 86400.0
MAX_BATCH = 10_000  # rows per claim: beyond it one transaction holds too many locks
# settings that existed once: refused (exit 78) with what replaced them, not "unknown"
REMOVED_KEYS = {
    "jobs.recording_finalize.max_failed_per_cycle":
        "removed: Missing verdicts now need evidence instead of a per-cycle cap"
        " (docs/architecture.md); delete this line",
}


def _setting(
    default: Any = _REQUIRED,
    doc: str = "",
    *,
    duration: bool = False,
    checks: Sequence[Check] = (),
    maximum: float | None = None,
) -> Any:
    """One setting; a numeric one names its *maximum* (checked after *checks*)."""
    bound = () if maximum is None else (_at_most(maximum, duration),)
    meta = {"doc": doc, "duration": duration, "checks": (*checks, *bound), "maximum": maximum}
    return attrs.field(default=default, metadata=meta)


def _at_most(limit: float, duration: bool) -> Check:
    def show(value: Any) -> str:
        return _show(value) if duration else repr(value)

    def check(value: Any) -> str | None:
        # not `value > limit`: NaN is past every limit too
        return None if value <= limit else f"must be <= {show(limit)}, got {show(value)}"

    return check


def _positive(value: Any) -> str | None:
    return None if value > 0 else f"must be > 0, got {_show(value)}"


def _non_negative(value: Any) -> str | None:
    return None if value >= 0 else f"must be >= 0, got {_show(value)}"


def _fraction(value: Any) -> str | None:
    return None if 0 <= value < 1 else f"must be >= 0 and < 1, got {_show(value)}"


def _at_least_one(value: Any) -> str | None:
    return None if value >= 1 else f"must be >= 1, got {_show(value)}"


def _one_of(*choices: str) -> Check:
    def check(value: Any) -> str | None:
        if value in choices:
            return None
        return f"must be one of {', '.join(choices)}; got {bounded_repr(value)}"

    return check


def _http_url(value: Any) -> str | None:
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises ValueError for a port out of range
    except ValueError as exc:  # "http://[::1": an unclosed IPv6 bracket
        return f"must be an http(s) URL, got {bounded_repr(redact_url(value))} ({exc})"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"must be an http(s) URL, got {bounded_repr(redact_url(value))}"
    if parts.username or parts.password:
        return "must not carry credentials in the URL (use the key/token settings)"
    return None


def _host_port(value: Any) -> str | None:
    host, sep, port = str(value).rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536 or \
            host.startswith("[") != host.endswith("]"):
        return f"must be HOST:PORT, got {bounded_repr(value)}"
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        if host != "localhost":
            return f"host must be an IP address or localhost, got {host!r}"
    return None


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _bootstrap(value: Any) -> str | None:
    servers = [s.strip() for s in str(value).split(",") if s.strip()]
    if not servers:
        return "must list at least one HOST:PORT"
    for server in servers:
        host, sep, port = server.rpartition(":")
        if not sep or not host or not port.isdigit():
            return f"must be a comma-separated list of HOST:PORT, got {bounded_repr(value)}"
    return None


def _dsn(value: Any) -> str | None:
    text = value.reveal()
    if not text.strip():
        return "must be set (a libpq connection string, e.g. postgresql://user@host/db)"
    if "://" in text and not text.startswith(("postgresql://", "postgres://")):
        return "must be a postgresql:// URL or a key=value connection string"
    try:
        params = parse_dsn(text)  # libpq's own reading; the message never quotes the DSN
    except InvalidDsn as exc:
        return str(exc)
    return dsn_transport_problem(params)


def _not_special_file(value: Any) -> str | None:
    """A file the daemon loads later (and names then when missing) is not a FIFO, a
    device or huge: loading it would block or never end."""
    if not value or ("\0" not in value and not os.path.lexists(value)):
        return None
    return regular_file_problem(value)


def _ca_file(value: Any) -> str | None:
    if not value:
        return None
    unsafe = regular_file_problem(value)
    if unsafe:
        return unsafe
    try:
        ssl.create_default_context(cafile=value)
    except ssl.SSLError:  # an OSError too: first
        return f"{bounded_repr(value)} holds no PEM certificate"
    except OSError as exc:
        return f"cannot read {bounded_repr(value)}: {exc.strerror or type(exc).__name__}"
    return None


@attrs.frozen
class PostgresConfig:
    dsn: Secret = _setting(
        doc="libpq DSN of the messenger database. Must be a direct connection (advisory "
        "locks are session-level; a transaction-mode pooler breaks single-runner). A host "
        "that is not loopback or a Unix socket needs sslmode=verify-full. Secret.",
        checks=[_dsn],
    )
    statement_timeout: float = _setting(
        20.0, "Server-side bound of one statement (libpq `options=-c statement_timeout`); "
        "the client gives up on a statement unanswered for statement_timeout + min(5s, "
        "statement_timeout) and closes that connection (a stopped backend never answers). "
        "Must be below every job's lock_ttl (the defaults fit a lock_ttl of 30s).",
        duration=True, checks=[_positive], maximum=HOUR,
    )
    lock_timeout: float = _setting(
        5.0, "Longest wait for a row or table lock another session holds; then the "
        "statement fails fast and its work is tried again in a later cycle. Must not exceed "
        "statement_timeout.",
        duration=True, checks=[_positive], maximum=10 * MINUTE,
    )
    idle_in_transaction_session_timeout: float = _setting(
        25.0, "The server ends a session idle inside a transaction this long (a frozen "
        "daemon releases its row locks). Must be below every job's lock_ttl.",
        duration=True, checks=[_positive], maximum=HOUR,
    )
    connect_timeout: float = _setting(
        5.0, "Bound of opening one connection (libpq `connect_timeout`, whole seconds, "
        "rounded up; libpq treats 1 as 2).",
        duration=True, checks=[_positive], maximum=2 * MINUTE,
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


def _readable_file(value: Any) -> str | None:
    if not value:
        return None
    if "\0" in value:
        return "the path holds a NUL character"
    path = Path(value)
    if not path.is_file():
        return f"no such file: {bounded_repr(value)}"
    if not os.access(path, os.R_OK):
        return f"file is not readable: {bounded_repr(value)}"
    return regular_file_problem(value)


class _NoPassphrase(Exception):
    """The private key is encrypted; no passphrase is configured."""


def _no_passphrase() -> str:
    # without a callback OpenSSL would prompt on the terminal for an encrypted key
    raise _NoPassphrase


@attrs.frozen
class KafkaConfig:
    bootstrap_servers: str = _setting(
        "127.0.0.1:9092", "Comma-separated HOST:PORT list of Kafka brokers.", checks=[_bootstrap]
    )
    client_id: str = _setting("safetynet", "Kafka client id.")
    security_protocol: SecurityProtocol = _setting(
        SecurityProtocol.PLAINTEXT, "PLAINTEXT, SSL (TLS), SASL_PLAINTEXT or SASL_SSL (SASL "
        "over TLS). A broker certificate the CA does not vouch for, or credentials the "
        "broker rejects, are a configuration fault (readiness 503), never a crash loop.",
    )
    sasl_mechanism: SaslMechanism = _setting(
        SaslMechanism.SCRAM_SHA_512, "PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (SASL_* "
        "protocols only). PLAIN sends the password itself: only over SASL_SSL (refused "
        "over SASL_PLAINTEXT whatever the broker).",
    )
    sasl_username: str = _setting("", "SASL user name; required by the SASL_* protocols.")
    sasl_password: Secret = _setting(
        Secret(""), "SASL password; required by the SASL_* protocols. Secret (pass it as "
        "SAFETYNET__KAFKA__SASL_PASSWORD).",
    )
    ssl_cafile: str = _setting(
        "", "PEM file of the CA(s) that sign the brokers' certificates (SSL/SASL_SSL); "
        "empty = the system's trust store. The broker's host name is always verified.",
        checks=[_readable_file],
    )
    ssl_certfile: str = _setting(
        "", "PEM client certificate for mutual TLS; empty = none. Needs ssl_keyfile.",
        checks=[_readable_file],
    )
    ssl_keyfile: str = _setting(
        "", "PEM private key (unencrypted) of ssl_certfile; empty = none. Refused when "
        "its group or others may read or write it (chmod 600 or 400).",
        checks=[_readable_file, key_file_problem],
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
            keyfile=self.ssl_keyfile or None, password=_no_passphrase)
        return context


@attrs.frozen
class S3Config:
    endpoint_url: str = _setting(
        "http://127.0.0.1:8333", "S3-compatible endpoint URL.", checks=[_http_url]
    )
    region: str = _setting("us-east-1", "Region used for SigV4 signing.")
    bucket: str = _setting("call-recordings", "Bucket of the CALL_RECORDINGS category.")
    key_prefix: str = _setting(
        "call-recordings/", "Object key prefix; a recording is {key_prefix}{recording_id}."
    )
    access_key_id: Secret = _setting(
        Secret(""), "Static S3 access key id; set it together with secret_access_key, or "
        "leave both empty to take the credentials from botocore's chain (AWS_* variables, "
        "web identity, shared credentials file, container or instance metadata; see "
        "docs/operations.md, S3 credentials). Secret.")
    secret_access_key: Secret = _setting(
        Secret(""), "Static S3 secret access key (with access_key_id). Secret.")
    profile: str = _setting(
        "", "Profile of the shared AWS config/credentials files the chain reads; empty = "
        "AWS_PROFILE, else `default`. Naming one skips the AWS_ACCESS_KEY_ID variables.")
    addressing_style: str = _setting(
        "path", "path (endpoint/bucket/key) or virtual (bucket.endpoint/key, "
        "virtual-hosted style).", checks=[_one_of("path", "virtual")])
    ca_file: str = _setting(
        "", "PEM file of the CA(s) that sign the S3 endpoint's certificate (a private CA); "
        "empty = the certifi bundle. A certificate it does not trust is a configuration "
        "fault.", checks=[_ca_file])
    timeout: float = _setting(5.0, "Timeout of one S3 request.", duration=True, checks=[_positive],
                              maximum=5 * MINUTE)
    concurrency: int = _setting(
        8, "Size of the S3 reconciler pool: HEAD requests on the wire at once (one"
        " connection each; the pool queues 2 per connection in the S3 worker). At most 256:"
        " the worker waits on its sockets with select(), which stops at 1,024 descriptors.",
        checks=[_positive], maximum=256)


@attrs.frozen
class MediaConfig:
    base_url: str = _setting(
        "http://127.0.0.1:8090", "Media stack base URL (recorder stop signal).", checks=[_http_url]
    )
    token: Secret = _setting(
        Secret(""), "Bearer token for the media stack; empty = none. Sent only over https://"
        " unless the host is loopback. Secret.")
    ca_file: str = _setting(
        "", "PEM bundle of the CA(s) that sign the media stack's certificate (a private CA);"
        " empty = the public CAs of certifi. Read when the daemon starts (exit 78 when it"
        " cannot be loaded) and when a reload changes [media] (refused when it cannot).",
        checks=[_not_special_file])
    timeout: float = _setting(
        2.0, "Timeout of one recorder stop request.", duration=True, checks=[_positive],
        maximum=MINUTE,
    )


@attrs.frozen
class RecordingFinalizeConfig:
    enabled: bool = _setting(True, "Run the job (RECORDINGS_ENABLED).")
    polling_interval: float = _setting(
        60.0, "Time between cycle starts.", duration=True, checks=[_positive], maximum=HOUR
    )
    batch_size: int = _setting(100, "Rows claimed per batch (exactly). At high `s3.concurrency` "
                               "keep it >= 4 x `s3.concurrency` (two reconciler pools), or "
                               "the claims cannot keep every connection busy.",
                               checks=[_positive],
                               maximum=MAX_BATCH)
    max_attempts: int = _setting(8, "Attempts before a row is quarantined.", checks=[_positive],
                                 maximum=100)
    finalize_sla_timeout: float = _setting(
        1800.0, "How long after its session ended a recording is reconciled.", duration=True,
        checks=[_non_negative], maximum=7 * DAY,
    )
    backoff_base: float = _setting(60.0, "First retry delay.", duration=True, checks=[_positive],
                                   maximum=DAY)
    backoff_factor: float = _setting(
        2.0, "Growth factor of the retry delay.", checks=[_at_least_one], maximum=10.0
    )
    backoff_cap: float = _setting(900.0, "Largest retry delay.", duration=True, checks=[_positive],
                                  maximum=7 * DAY)
    backoff_jitter: float = _setting(
        0.2, "Random +/- fraction applied to each delay.", checks=[_fraction], maximum=0.9
    )
    lock_ttl: float = _setting(
        300.0, "TTL of the job's lease and bound of one cycle; must exceed max_run_duration. "
        "The lease is renewed every lock_ttl/4 while a cycle runs: a frozen leader is "
        "replaced this long after its last renewal (plus one polling_interval).",
        duration=True, checks=[_positive], maximum=2 * HOUR,
    )
    max_run_duration: float = _setting(
        180.0, "A cycle stops claiming after this long.", duration=True, checks=[_positive],
        maximum=HOUR,
    )
    redrive_after: float = _setting(
        900.0, "Self-healing quarantine: rows quarantined for an object-storage failure "
        "(last_error s3:*) are requeued once S3 has been healthy this long (every cycle's "
        "probe green, its breaker closed, no transient HEAD), batch_size per cycle.",
        duration=True, checks=[_non_negative], maximum=7 * DAY,
    )
    redrive_max: int = _setting(
        3, "How many times one row is requeued by itself; past it, it waits for "
        "`safetynet requeue`. 0 turns the self-healing off.",
        checks=[_non_negative], maximum=100,
    )


@attrs.frozen
class ConferenceReaperConfig:
    enabled: bool = _setting(True, "Run the job (CONFERENCE_CALLS_ENABLED).")
    polling_interval: float = _setting(
        30.0, "Time between cycle starts.", duration=True, checks=[_positive], maximum=HOUR
    )
    batch_size: int = _setting(100, "Conferences claimed per phase and cycle.", checks=[_positive],
                               maximum=MAX_BATCH)
    empty_room_grace: float = _setting(
        90.0, "An Active room with nobody in it is ended after this long.", duration=True,
        checks=[_positive], maximum=DAY,
    )
    provision_timeout: float = _setting(
        120.0, "A Provisioning conference fails after this long.", duration=True,
        checks=[_positive], maximum=DAY,
    )
    stale_live_timeout: float = _setting(
        14400.0, "An Active conference with no activity is ended after this long.",
        duration=True, checks=[_positive], maximum=30 * DAY,
    )
    lock_ttl: float = _setting(
        120.0, "TTL of the job's lease and bound of one cycle; must exceed max_run_duration. "
        "The lease is renewed every lock_ttl/4 while a cycle runs: a frozen leader is "
        "replaced this long after its last renewal (plus one polling_interval).",
        duration=True, checks=[_positive], maximum=2 * HOUR,
    )
    max_run_duration: float = _setting(
        30.0, "A cycle stops claiming after this long.", duration=True, checks=[_positive],
        maximum=HOUR,
    )
    poison_backoff_cap: float = _setting(
        3600.0, "A poison conference (its outcome cannot be written, or it started after "
        "AsOf) is out of the claim for polling_interval x 2^failures, at most this long.",
        duration=True, checks=[_positive], maximum=7 * DAY,
    )


@attrs.frozen
class JobsConfig:
    recording_finalize: RecordingFinalizeConfig = attrs.field(factory=RecordingFinalizeConfig)
    conference_reaper: ConferenceReaperConfig = attrs.field(factory=ConferenceReaperConfig)


@attrs.frozen
class OutboxRelayConfig:
    enabled: bool = _setting(True, "Run the Kafka outbox relay.")
    batch_size: int = _setting(500, "Outbox rows claimed per batch.", checks=[_positive],
                               maximum=MAX_BATCH)
    poll_interval: float = _setting(
        1.0, "Fallback poll period; LISTEN/NOTIFY wakes the relay sooner.", duration=True,
        checks=[_positive], maximum=5 * MINUTE,
    )
    retention: float = _setting(
        604800.0, "Published rows older than this are deleted.", duration=True,
        checks=[_positive], maximum=365 * DAY,
    )
    retention_enabled: bool = _setting(
        True, "Delete published rows older than retention (through the ix_outbox_published "
        "index); false when the messenger owns its outbox's retention.")
    wakeup: str = _setting(
        "notify", "How relays learn of new outbox rows: `notify` (`safetynet migrate` "
        "installs a statement-level NOTIFY trigger on messenger.integration_outbox, polling "
        "stays the fallback) or `poll` (no trigger on the messenger's table: migrate drops "
        "it; rows wait up to poll_interval).", checks=[_one_of("notify", "poll")])
    lock_ttl: float = _setting(
        60.0, "TTL of the relay's lease (renewed every lock_ttl/4 while a cycle runs; a "
        "frozen leader is replaced this long after its last renewal). A relay cycle runs "
        "at most half of it.", duration=True, checks=[_positive], maximum=DAY,
    )
    claim_max_bytes: int = _setting(
        16 * 1024 * 1024, "Bytes of outbox rows (payload, headers, key) one claim fetches at "
        "most; a claim stops before the row that would pass it (its first row always comes). "
        "The relay holds about two claims, so its memory stays bounded whatever the rows "
        "hold. A row larger than the producer's max request size (1 MiB) is dead-lettered "
        "without its payload being fetched.", checks=[_positive], maximum=1024 * 1024 * 1024,
    )
    dead_letter_retention: float = _setting(
        2592000.0, "Dead letters older than this are deleted together with their outbox "
        "row, unless one still blocks later rows of its key (`safetynet replay` puts one "
        "back instead).", duration=True, checks=[_positive], maximum=365 * DAY,
    )
    notify_min_interval: float = _setting(
        0.05, "Shortest time between two relay wake-ups from NOTIFY safetynet_outbox; "
        "notifications in between are coalesced into one wake-up at its end (any login may "
        "NOTIFY).", duration=True, checks=[_non_negative], maximum=MINUTE,
    )


@attrs.frozen
class AuditConfig:
    enabled: bool = _setting(True, "Run the auditor actor in `safetynet run` (the SQL-only "
                             "invariants of `safetynet audit`, every interval).")
    interval: float = _setting(
        300.0, "Time between the auditor actor's runs.", duration=True, checks=[_positive],
        maximum=DAY,
    )
    window: float = _setting(
        900.0, "How far back the auditor actor looks at terminal transitions and outbox "
        "rows (`safetynet audit --since` overrides it); at least interval + grace, so every "
        "transition is judged by one run. Never further than outbox_relay.retention: "
        "pruned outbox rows are not violations. A run's cost grows with the rows inside it.",
        duration=True, checks=[_positive], maximum=365 * DAY,
    )
    grace: float = _setting(
        300.0, "A transition younger than this is not judged yet (an Available recording "
        "is republished within a polling interval).", duration=True,
        checks=[_non_negative], maximum=DAY,
    )
    relay_lag: float = _setting(
        300.0, "An unpublished outbox row younger than this is not a violation.",
        duration=True, checks=[_non_negative], maximum=DAY,
    )
    max_violations: int = _setting(
        1000, "Violations reported per invariant and run at most (the gauge saturates here).",
        checks=[_positive], maximum=100_000,
    )
    s3_sample: int = _setting(
        50, "`safetynet audit`: Failed recordings HEADed at most per run (failed_with_object).",
        checks=[_non_negative], maximum=10_000,
    )
    s3_rate: float = _setting(
        10.0, "`safetynet audit`: HEAD requests per second at most.", checks=[_positive],
        maximum=1000.0,
    )
    kafka_max_messages: int = _setting(
        100_000, "`safetynet audit --kafka`: messages read at most; a window holding more "
        "cannot be judged (exit 1).", checks=[_positive], maximum=500_000,
    )
    kafka_timeout: float = _setting(
        30.0, "`safetynet audit --kafka`: bound of the whole topic read.", duration=True,
        checks=[_positive], maximum=HOUR,
    )
    kafka_max_bytes: int = _setting(
        256 * 1024 * 1024, "`safetynet audit --kafka`: bytes of messages (keys, values, "
        "headers) read at most; a window holding more cannot be judged (exit 1).",
        checks=[_positive], maximum=4 * 1024 * 1024 * 1024,
    )


@attrs.frozen
class HttpConfig:
    listen: str = _setting(
        "127.0.0.1:9464", "HOST:PORT of /metrics, /healthz, /readyz (loopback by default).",
        checks=[_host_port],
    )


@attrs.frozen
class LoggingConfig:
    level: str = _setting(
        "info", "Log level.", checks=[_one_of("debug", "info", "warning", "error")]
    )
    format: str = _setting("json", "json (one object per line) or console.",
                           checks=[_one_of("json", "console")])


@attrs.frozen
class SupervisionConfig:
    max_restarts: int = _setting(
        5, "Restarts allowed per actor within restart_window before escalating.",
        checks=[_non_negative], maximum=1000,
    )
    restart_window: float = _setting(
        60.0, "Window of the restart intensity.", duration=True, checks=[_positive], maximum=DAY
    )
    shutdown_grace: float = _setting(
        10.0, "Time in-flight work gets to commit or roll back on SIGTERM.", duration=True,
        checks=[_positive], maximum=10 * MINUTE,
    )


@attrs.frozen
class TracingConfig:
    endpoint: str = _setting(
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


def _cross_checks(cfg: Config) -> Iterable[str]:
    """Rules that involve more than one key."""
    for name in ("recording_finalize", "conference_reaper"):
        job = getattr(cfg.jobs, name)
        if job.lock_ttl <= job.max_run_duration:
            yield (
                f"jobs.{name}.lock_ttl: must be greater than max_run_duration "
                f"({format_duration(job.max_run_duration)}), got {format_duration(job.lock_ttl)}"
            )
    pg = cfg.postgres
    ttls = {f"jobs.{name}.lock_ttl": getattr(cfg.jobs, name).lock_ttl
            for name in ("recording_finalize", "conference_reaper")}
    ttls["outbox_relay.lock_ttl"] = cfg.outbox_relay.lock_ttl
    for key in ("statement_timeout", "idle_in_transaction_session_timeout"):
        value = getattr(pg, key)
        for ttl_key, ttl in ttls.items():
            if value >= ttl:
                yield (f"postgres.{key}: must be below {ttl_key} "
                       f"({format_duration(ttl)}), got {format_duration(value)}")
    if pg.lock_timeout > pg.statement_timeout:
        yield (f"postgres.lock_timeout: must be <= statement_timeout "
               f"({format_duration(pg.statement_timeout)}), got "
               f"{format_duration(pg.lock_timeout)}")
    yield from _kafka_checks(cfg.kafka)
    yield from _s3_checks(cfg.s3)
    media = urlsplit(cfg.media.base_url)
    if cfg.media.token and media.scheme == "http" and not _loopback(media.hostname or ""):
        yield (f"media.base_url: must be https:// when media.token is set (the token would "
               f"cross the network in clear text to {media.hostname}), got http://")
    audit = cfg.audit
    if audit.window < audit.interval + audit.grace:
        yield (f"audit.window: must be >= interval + grace "
               f"({format_duration(audit.interval + audit.grace)}), got "
               f"{format_duration(audit.window)}")
    rf = cfg.jobs.recording_finalize
    if rf.backoff_cap < rf.backoff_base:
        yield (
            f"jobs.recording_finalize.backoff_cap: must be >= backoff_base "
            f"({format_duration(rf.backoff_base)}), got {format_duration(rf.backoff_cap)}"
        )


def _kafka_checks(kafka: KafkaConfig) -> Iterable[str]:
    """The security settings fit the protocol, and the TLS files load."""
    protocol = kafka.security_protocol
    if protocol.uses_sasl:
        for key in ("sasl_username", "sasl_password"):
            if not getattr(kafka, key):
                yield f"kafka.{key}: required when security_protocol is {protocol}"
        if protocol is SecurityProtocol.SASL_PLAINTEXT and \
                kafka.sasl_mechanism is SaslMechanism.PLAIN:
            # refused whatever the host: "loopback" is only what the bootstrap list
            # says, the brokers it returns may be anywhere
            yield ("kafka.sasl_mechanism: PLAIN over SASL_PLAINTEXT would send the "
                   "password in clear; use SASL_SSL or SCRAM")
    else:
        for key in ("sasl_username", "sasl_password"):
            if getattr(kafka, key):
                yield (f"kafka.{key}: set, but security_protocol {protocol} does not "
                       "authenticate (use SASL_SSL or SASL_PLAINTEXT)")
    files = ("ssl_cafile", "ssl_certfile", "ssl_keyfile")
    if not protocol.uses_tls:
        for key in files:
            if getattr(kafka, key):
                yield (f"kafka.{key}: set, but security_protocol {protocol} does not use "
                       "TLS (use SSL or SASL_SSL)")
        return
    if bool(kafka.ssl_certfile) != bool(kafka.ssl_keyfile):
        missing, given = (("ssl_keyfile", "ssl_certfile") if kafka.ssl_certfile
                          else ("ssl_certfile", "ssl_keyfile"))
        yield f"kafka.{missing}: required with {given} (mutual TLS needs both)"
        return
    try:
        ssl.create_default_context(cafile=kafka.ssl_cafile or None)
    except (ssl.SSLError, OSError) as exc:
        yield f"kafka.ssl_cafile: holds no usable CA certificate ({ssl_reason(exc)})"
        return
    try:
        kafka.ssl_context()
    except _NoPassphrase:
        yield "kafka.ssl_keyfile: the key is encrypted; give an unencrypted key"
    except (ssl.SSLError, OSError) as exc:
        yield (f"kafka.ssl_certfile: with ssl_keyfile, not a usable certificate and key "
               f"({ssl_reason(exc)})")


def ssl_reason(exc: BaseException) -> str:
    """OpenSSL's words without the library tag and source line: ``key values mismatch``."""
    text = str(exc)
    while text.startswith("[") and "] " in text:  # "[Errno 1] [SSL: TAG] words"
        text = text.split("] ", 1)[1]
    return text.split(" (_ssl.c", 1)[0]


def _s3_checks(s3: S3Config) -> Iterable[str]:
    if bool(s3.access_key_id) != bool(s3.secret_access_key):
        missing = "secret_access_key" if s3.access_key_id else "access_key_id"
        yield (f"s3.{missing}: must be set together with "
               f"{'access_key_id' if s3.access_key_id else 'secret_access_key'} (or leave "
               "both empty to use the credential chain)")
    if s3.ca_file and not s3.endpoint_url.startswith("https://"):
        yield "s3.ca_file: set, but s3.endpoint_url is not https://"
    if s3.addressing_style == "virtual" and (s3.bucket != s3.bucket.lower() or "." in s3.bucket
                                             or "_" in s3.bucket):
        yield (f"s3.bucket: {s3.bucket!r} cannot be a host name label (lower case, no dots "
               "or underscores) with s3.addressing_style = virtual")


# --------------------------------------------------------------------------- loading


class _FromEnv(str):
    """A string that came from the environment, so ``"5"`` may mean the integer 5."""


def config_paths(cli_paths: Sequence[str | Path], env: Mapping[str, str]) -> list[Path]:
    """The files to load: ``-c`` options in order, else ``$SAFETYNET_CONFIG``, else none."""
    if cli_paths:
        return [Path(p) for p in cli_paths]
    if env.get(ENV_CONFIG_FILE):
        return [Path(env[ENV_CONFIG_FILE])]
    return []


def load_config(paths: Sequence[Path], env: Mapping[str, str] | None = None) -> Config:
    """Merge *paths* in order, apply env overrides, validate; raise :class:`ConfigError`."""
    env = os.environ if env is None else env
    problems: list[str] = []
    raw: dict[str, Any] = {}
    for path in paths:
        try:
            text = read_config_text(path)
        except UnreadableFile as exc:
            problems.append(f"{path}: cannot read config file: {exc}")
            continue
        try:
            _deep_merge(raw, tomllib.loads(text))
        except tomllib.TOMLDecodeError as exc:
            problems.append(f"{path}: invalid TOML: {exc}")
        except RecursionError:
            key, line = deep_nesting_key(text)
            problems.append(f"{key}: arrays or tables nested too deeply ({path}, line {line})")
    for name, value in sorted(env.items()):
        if name.startswith(ENV_PREFIX):
            keys = [k.lower() for k in name[len(ENV_PREFIX):].split("__")]
            if all(keys):
                _set_path(raw, keys, _FromEnv(value), problems, name)
            else:
                problems.append(f"{name}: malformed variable name")
    if problems:
        raise ConfigError(problems)
    return config_from_dict(raw)


def config_from_dict(raw: Mapping[str, Any]) -> Config:
    """Validate already-merged settings (a TOML-shaped mapping); raise :class:`ConfigError`."""
    problems: list[str] = []
    try:
        cfg = _build(Config, raw, "", problems)
    except RecursionError:  # a table nested past the recursion limit (from the env)
        raise ConfigError([*problems, "configuration: tables nested too deeply"]) from None
    if cfg is not None and not problems:
        try:
            problems.extend(_cross_checks(cfg))
        except Exception as exc:
            problems.append(guarded_problem("configuration", exc))
    if problems or cfg is None:
        raise ConfigError(problems)
    return cfg


def _deep_merge(into: dict[str, Any], new: Mapping[str, Any]) -> None:
    for key, value in new.items():
        if isinstance(value, Mapping) and isinstance(into.get(key), dict):
            _deep_merge(into[key], value)
        else:
            into[key] = dict(value) if isinstance(value, Mapping) else value


def _set_path(
    raw: dict[str, Any], keys: list[str], value: str, problems: list[str], var: str
) -> None:
    node = raw
    for key in keys[:-1]:
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            problems.append(f"{var}: {key} is not a section")
            return
        node = child
    node[keys[-1]] = value


_C = TypeVar("_C")


def _build(cls: type[_C], data: Any, prefix: str, problems: list[str]) -> _C | None:
    if not isinstance(data, Mapping):
        problems.append(f"{prefix.rstrip('.')}: expected a table, got {_type_name(data)}")
        return None
    fields = {f.name: f for f in attrs.fields(cls)}  # type: ignore[arg-type]
    for key in data:
        if f"{prefix}{key}" in REMOVED_KEYS:
            problems.append(f"{prefix}{key}: {REMOVED_KEYS[prefix + key]}")
        elif key not in fields:
            hint = difflib.get_close_matches(key, list(fields), n=1)
            suggestion = f" (did you mean '{hint[0]}'?)" if hint else ""
            problems.append(f"{prefix}{key}: unknown key{suggestion}")
    kwargs: dict[str, Any] = {}
    start = len(problems)
    hints = attrs.resolve_types(cls)  # type: ignore[type-var]
    for name, field in fields.items():
        key = f"{prefix}{name}"
        ftype: Any = attrs.fields_dict(hints)[name].type  # type: ignore[arg-type]
        if attrs.has(ftype):
            kwargs[name] = _build(ftype, data.get(name, {}), f"{key}.", problems)
            continue
        if name not in data:
            if field.default is _REQUIRED:
                problems.append(f"{key}: required, not set")
            continue
        try:
            value = _convert(ftype, data[name], field.metadata.get("duration", False))
        except ValueError as exc:
            problems.append(f"{key}: {exc}")
            continue
        except Exception as exc:
            problems.append(guarded_problem(key, exc))
            continue
        for check in field.metadata.get("checks", ()):
            try:
                message = check(value)
            except Exception as exc:
                message = guarded_problem("", exc)
            if message:
                problems.append(f"{key}: {message}")
                break
        else:
            kwargs[name] = value
    if len(problems) > start:
        return None
    return cls(**kwargs)


def _convert(ftype: Any, value: Any, duration: bool) -> Any:
    from_env = isinstance(value, _FromEnv)
    if duration:
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise ValueError(f"expected a duration like \"90s\" or a number of seconds, "
                             f"got {_type_name(value)} {bounded_repr(value)}")
        return parse_duration(str(value) if from_env else value)
    if isinstance(ftype, type) and issubclass(ftype, enum.Enum):
        choices = ", ".join(member.value for member in ftype)
        if not isinstance(value, str):
            raise ValueError(
                f"expected one of {choices}, got {_type_name(value)} {bounded_repr(value)}")
        try:
            return ftype(value.strip().upper())
        except ValueError:
            raise ValueError(f"must be one of {choices}; got {str(value)!r}") from None
    if ftype == tuple[str, ...]:  # an array of strings (from the environment: comma-separated)
        items = value.split(",") if isinstance(value, str) else value
        if not isinstance(items, list | tuple) or not all(isinstance(i, str) for i in items):
            raise ValueError(f"expected an array of strings, got {_type_name(value)}")
        return tuple(i.strip() for i in items if i.strip())
    if ftype is Secret:
        if not isinstance(value, str):
            raise ValueError(f"expected a string, got {_type_name(value)}")
        return Secret(str(value))
    if ftype is bool:
        if from_env:
            lowered = value.strip().lower()
            if lowered in ("true", "1", "yes", "on"):
                return True
            if lowered in ("false", "0", "no", "off"):
                return False
            raise ValueError(f"expected true or false, got {str(value)!r}")
        if not isinstance(value, bool):
            raise ValueError(
                f"expected true or false, got {_type_name(value)} {bounded_repr(value)}")
        return value
    if ftype is int:
        if from_env:
            try:
                return int(value)
            except ValueError:
                raise ValueError(f"expected an integer, got {str(value)!r}") from None
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"expected an integer, got {_type_name(value)} {bounded_repr(value)}")
        return value
    if ftype is float:
        if from_env:
            try:
                return float(value)
            except ValueError:
                raise ValueError(f"expected a number, got {str(value)!r}") from None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"expected a number, got {_type_name(value)} {bounded_repr(value)}")
        return float(value)
    if not isinstance(value, str):
        raise ValueError(f"expected a string, got {_type_name(value)} {bounded_repr(value)}")
    return str(value)


def _type_name(value: Any) -> str:
    import datetime as dt

    names = {bool: "boolean", int: "integer", float: "float", str: "string", dict: "table",
             list: "array", dt.datetime: "TOML datetime", dt.date: "TOML date",
             dt.time: "TOML time"}
    return names.get(type(value), type(value).__name__)



def _show(value: Any) -> str:
    if isinstance(value, float) and math.isfinite(value) and value >= 0:
        return format_duration(value)
    return repr(value)


# --------------------------------------------------------------------------- presenting


def redacted(cfg: Any) -> dict[str, Any]:
    """*cfg* as plain data for printing: durations spelled out, secrets masked."""
    out: dict[str, Any] = {}
    for field in attrs.fields(type(cfg)):
        value = getattr(cfg, field.name)
        if attrs.has(type(value)):
            out[field.name] = redacted(value)
        elif isinstance(value, Secret):
            if field.name == "dsn":
                out[field.name] = redact_dsn(value.reveal())
            else:
                out[field.name] = REDACTED if value else ""
        elif isinstance(value, enum.Enum):
            out[field.name] = value.value
        elif field.metadata.get("duration"):
            out[field.name] = format_duration(value)
        elif isinstance(value, str) and "://" in value:  # every URL setting
            out[field.name] = redact_url(value)
        else:
            out[field.name] = value
    return out


@attrs.frozen
class SettingDoc:
    key: str
    type: str
    default: str
    doc: str
    maximum: str = ""  # numeric settings: the largest value accepted


def settings_reference(cls: type[Any] = Config, prefix: str = "") -> list[SettingDoc]:
    """Every setting with its type, default and doc: docs/configuration.md is made from it."""
    rows: list[SettingDoc] = []
    hints = attrs.fields_dict(attrs.resolve_types(cls))
    for name, field in hints.items():
        key = f"{prefix}{name}"
        ftype: Any = field.type
        default: Any = field.default
        if attrs.has(ftype):
            rows.extend(settings_reference(ftype, f"{key}."))
            continue
        duration = field.metadata.get("duration", False)
        kind = "duration" if duration else getattr(ftype, "__name__", str(ftype))
        kind = "secret string" if ftype is Secret else kind
        kind = "array of strings" if ftype == tuple[str, ...] else kind
        if isinstance(ftype, type) and issubclass(ftype, enum.Enum):
            kind = "one of " + ", ".join(member.value for member in ftype)
        if default is _REQUIRED:
            shown = "(required)"
        elif duration:
            shown = f'"{format_duration(default)}"'
        elif isinstance(default, tuple):
            shown = "[" + ", ".join(f'"{d}"' for d in default) + "]"
        elif isinstance(default, Secret | str):
            shown = f'"{default}"'
        else:
            shown = str(default).lower() if isinstance(default, bool) else str(default)
        maximum = field.metadata.get("maximum")
        limit = "" if maximum is None else (
            f'"{format_duration(maximum)}"' if duration
            else str(maximum) if isinstance(maximum, int) else f"{maximum:g}")
        rows.append(SettingDoc(key, kind, shown, field.metadata.get("doc", ""), limit))
    return rows


def reference_markdown() -> str:
    """The configuration reference table, as it stands in docs/configuration.md."""
    lines = ["| key | type | default | max | meaning |", "|---|---|---|---|---|"]
    for row in settings_reference():
        limit = f"`{row.maximum}`" if row.maximum else ""
        lines.append(f"| `{row.key}` | {row.type} | `{row.default}` | {limit} | {row.doc} |")
    return "\n".join(lines)
