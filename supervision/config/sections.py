"""The sections of the runtime and its services: one frozen attrs class per TOML table.

>>> PostgresConfig(dsn=Secret("postgresql://app@127.0.0.1/messenger")).statement_timeout
20.0

Every setting is a field made by :func:`~supervision.config.fields.setting`: its metadata
carries the documentation, the kind of value (duration) and its checks, so the loader,
the docs/configuration.md reference and ``check-config`` all come from this one place. A
rule across the keys of one section is that section's ``problems(key)``, which the
generic checks (:mod:`.checks`) call. The jobs' sections live with their jobs
(``actors/<job>/settings.py``), the root that holds them all in the composition root
(:mod:`supervision.app.settings`).
"""

from __future__ import annotations

import enum
import ssl
from collections.abc import Iterator
from urllib.parse import urlsplit

import attrs

from supervision.config.certificates import (
    NoPassphrase,
    ca_file,
    key_file_problem,
    media_ca_file,
    no_passphrase,
    readable_file,
    ssl_reason,
)
from supervision.config.fields import DAY, HOUR, MINUTE, non_negative, one_of, positive, setting
from supervision.config.values import (
    bootstrap,
    dsn,
    host_port,
    http_url,
    is_loopback,
    tracing_url,
)
from supervision.durations import format_duration
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

    def problems(self, key: str) -> Iterator[str]:
        """What is wrong with the section across its keys (*key*: its dotted key)."""
        if self.lock_timeout > self.statement_timeout:
            yield (f"{key}.lock_timeout: must be <= statement_timeout "
                   f"({format_duration(self.statement_timeout)}), got "
                   f"{format_duration(self.lock_timeout)}")


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


class Acks(enum.StrEnum):
    """What the producer waits for before a row counts as published (Kafka's ``acks``).
    ``0`` is not offered: the relay marks a row published only on an acknowledgement."""

    ALL = "all"  # every in-sync replica has the message
    LEADER = "1"  # the partition's leader has it

    @classmethod
    def _missing_(cls, value: object) -> Acks | None:
        """Any case of "all" (the loader reads enum values upper-cased)."""
        return cls.ALL if isinstance(value, str) and value.lower() == "all" else None

    @property
    def aiokafka(self) -> str | int:
        return "all" if self is Acks.ALL else 1


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
    acks: Acks = setting(
        Acks.ALL, "all: a row is marked published once every in-sync replica has its "
        "message (the default); 1: once the partition's leader has it (less latency, but "
        "an event the leader acknowledged and lost before replicating is never sent again).",
    )
    enable_idempotence: bool = setting(
        False, "aiokafka's idempotent producer (a producer id and per-partition sequence "
        "numbers: the broker drops a batch it already has when a send is retried inside "
        "one producer session). Needs acks = \"all\". Off by default: the relay is at least "
        "once across restarts whatever this says, consumers deduplicate by event-id; a "
        "broker that refuses InitProducerId (Tansu, the dev broker) fails the producer's "
        "start, seen as Kafka unreachable.",
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
        if not self.security_protocol.uses_tls:
            return None
        # here, after the protocol: aiokafka (~45 ms of imports) loads for a TLS config only
        from aiokafka.helpers import create_ssl_context

        context: ssl.SSLContext = create_ssl_context(
            cafile=self.ssl_cafile or None, certfile=self.ssl_certfile or None,
            keyfile=self.ssl_keyfile or None, password=no_passphrase)
        return context

    def problems(self, key: str) -> Iterator[str]:
        """Idempotence has acks = all; the security settings fit the protocol, and the
        TLS files load."""
        if self.enable_idempotence and self.acks is not Acks.ALL:
            yield (f"{key}.enable_idempotence: needs acks = \"all\" (acks is "
                   f"\"{self.acks}\")")
        protocol = self.security_protocol
        if protocol.uses_sasl:
            for name in ("sasl_username", "sasl_password"):
                if not getattr(self, name):
                    yield f"{key}.{name}: required when security_protocol is {protocol}"
            if protocol is SecurityProtocol.SASL_PLAINTEXT and \
                    self.sasl_mechanism is SaslMechanism.PLAIN:
                # refused whatever the host: "loopback" is only what the bootstrap list
                # says, the brokers it returns may be anywhere
                yield (f"{key}.sasl_mechanism: PLAIN over SASL_PLAINTEXT would send the "
                       "password in clear; use SASL_SSL or SCRAM")
        else:
            for name in ("sasl_username", "sasl_password"):
                if getattr(self, name):
                    yield (f"{key}.{name}: set, but security_protocol {protocol} does not "
                           "authenticate (use SASL_SSL or SASL_PLAINTEXT)")
        files = ("ssl_cafile", "ssl_certfile", "ssl_keyfile")
        if not protocol.uses_tls:
            for name in files:
                if getattr(self, name):
                    yield (f"{key}.{name}: set, but security_protocol {protocol} does not "
                           "use TLS (use SSL or SASL_SSL)")
            return
        if bool(self.ssl_certfile) != bool(self.ssl_keyfile):
            missing, given = (("ssl_keyfile", "ssl_certfile") if self.ssl_certfile
                              else ("ssl_certfile", "ssl_keyfile"))
            yield f"{key}.{missing}: required with {given} (mutual TLS needs both)"
            return
        try:
            ssl.create_default_context(cafile=self.ssl_cafile or None)
        except (ssl.SSLError, OSError) as exc:
            yield f"{key}.ssl_cafile: holds no usable CA certificate ({ssl_reason(exc)})"
            return
        try:
            self.ssl_context()
        except NoPassphrase:
            yield f"{key}.ssl_keyfile: the key is encrypted; give an unencrypted key"
        except (ssl.SSLError, OSError) as exc:
            yield (f"{key}.ssl_certfile: with ssl_keyfile, not a usable certificate and "
                   f"key ({ssl_reason(exc)})")


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
        "", "Profile of the shared AWS config and credentials files the chain reads; empty = "
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

    def problems(self, key: str) -> Iterator[str]:
        """Static keys come in pairs; a CA file needs https; a virtual-hosted bucket is
        a host name label."""
        if bool(self.access_key_id) != bool(self.secret_access_key):
            missing = "secret_access_key" if self.access_key_id else "access_key_id"
            yield (f"{key}.{missing}: must be set together with "
                   f"{'access_key_id' if self.access_key_id else 'secret_access_key'} (or "
                   "leave both empty to use the credential chain)")
        if self.ca_file and not self.endpoint_url.startswith("https://"):
            yield f"{key}.ca_file: set, but {key}.endpoint_url is not https://"
        if self.addressing_style == "virtual" and (
                self.bucket != self.bucket.lower() or "." in self.bucket or "_" in self.bucket):
            yield (f"{key}.bucket: {self.bucket!r} cannot be a host name label (lower case, "
                   f"no dots or underscores) with {key}.addressing_style = virtual")


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

    def problems(self, key: str) -> Iterator[str]:
        """A token never crosses the network in clear."""
        url = urlsplit(self.base_url)
        if self.token and url.scheme == "http" and not is_loopback(url.hostname or ""):
            yield (f"{key}.base_url: must be https:// when {key}.token is set (the token "
                   f"would cross the network in clear text to {url.hostname}), got http://")


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
