"""Rules that involve more than one key, run once every setting is valid on its own.

>>> list(cross_checks(cfg))
['jobs.recording_finalize.lock_ttl: must be greater than max_run_duration (3m), got 3m']

Each leased job's block (:class:`~supervision.config.jobs.LeasedJob`) checks itself;
the PostgreSQL timeouts stay below every lease's TTL; the Kafka security settings fit the
protocol and its TLS files load as the producer will load them; S3 keys come in pairs;
a media token never crosses the network in clear; the auditor's window covers a run.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from urllib.parse import urlsplit

import attrs

from supervision.config.certificates import NoPassphrase, ssl_reason
from supervision.config.jobs import JobsConfig, LeasedJob
from supervision.config.sections import (
    Config,
    KafkaConfig,
    S3Config,
    SaslMechanism,
    SecurityProtocol,
)
from supervision.config.values import is_loopback
from supervision.durations import format_duration


def leased_jobs(cfg: Config) -> Iterator[tuple[str, LeasedJob]]:
    """(dotted key, section) of every job run under a lease, in declaration order."""
    for field in attrs.fields(JobsConfig):
        section = getattr(cfg.jobs, field.name)
        if isinstance(section, LeasedJob):
            yield f"jobs.{field.name}", section


def cross_checks(cfg: Config) -> Iterator[str]:
    """Rules that involve more than one key, one line per problem."""
    jobs = list(leased_jobs(cfg))
    for key, job in jobs:
        yield from job.lease_problems(key)
    pg = cfg.postgres
    ttls = {f"{key}.lock_ttl": job.lock_ttl for key, job in jobs}
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
    if cfg.media.token and media.scheme == "http" and not is_loopback(media.hostname or ""):
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


def _kafka_checks(kafka: KafkaConfig) -> Iterator[str]:
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
    except NoPassphrase:
        yield "kafka.ssl_keyfile: the key is encrypted; give an unencrypted key"
    except (ssl.SSLError, OSError) as exc:
        yield (f"kafka.ssl_certfile: with ssl_keyfile, not a usable certificate and key "
               f"({ssl_reason(exc)})")


def _s3_checks(s3: S3Config) -> Iterator[str]:
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
