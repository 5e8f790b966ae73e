"""Kafka TLS and SASL: the settings aiokafka gets, and telling a refusal from an outage.

>>> client_security(cfg.kafka)["security_protocol"]
'SASL_SSL'
>>> refusal(exc)            # a one-line reason when the broker refuses *us*, else None
'SSLCertVerificationError: certificate verify failed: unable to get local issuer certificate'

What aiokafka 0.14 raises when the broker will not have us (each seen against Tansu
behind stunnel, see tests/integration/outbox/test_kafka_security.py):

* an untrusted broker certificate — ``ssl.SSLCertVerificationError`` from the handshake;
  ``AIOKafkaProducer.start()`` only logs it and raises ``KafkaConnectionError("Unable to
  bootstrap from ...")``, which a dead broker raises too;
* a client certificate the broker refuses (mutual TLS) — ``KafkaConnectionError
  ("Connection ... closed")`` caused by an ``ssl.SSLError`` alert (``unknown ca``,
  ``certificate required``);
* SCRAM credentials the broker rejects — the server's final message is ``e=<error>``
  (RFC 5802) and aiokafka's authenticator fails on it with a bare ``KeyError('v')``
  (``ValueError`` for a wrong server signature), straight out of ``start()``;
* the broker's own SASL/authorization error codes — ``SaslAuthenticationFailed``,
  ``UnsupportedSaslMechanismError`` and kin (:data:`REFUSALS`).

Because ``start()`` hides the handshake's error, :func:`diagnose` repeats the connection
the way aiokafka makes it (``aiokafka.conn.create_conn`` with the same settings) to each
bootstrap server and returns what it raised.
"""

from __future__ import annotations

import ssl
import traceback
from typing import Any

from aiokafka.conn import create_conn
from aiokafka.errors import (
    AuthenticationFailedError,
    AuthenticationMethodNotSupported,
    ClusterAuthorizationFailedError,
    IllegalSaslStateError,
    SaslAuthenticationFailed,
    TopicAuthorizationFailedError,
    UnsupportedSaslMechanismError,
)

from supervision.config import KafkaConfig, ssl_reason

REFUSALS = (
    TopicAuthorizationFailedError, ClusterAuthorizationFailedError, SaslAuthenticationFailed,
    AuthenticationFailedError, AuthenticationMethodNotSupported,
    UnsupportedSaslMechanismError, IllegalSaslStateError,
)
RESET_TRIES = 8
# TLS errors that mean the connection broke, not that a peer refused a certificate
_TLS_BREAKS = (ssl.SSLEOFError, ssl.SSLSyscallError, ssl.SSLZeroReturnError,
               ssl.SSLWantReadError, ssl.SSLWantWriteError)


def client_security(cfg: KafkaConfig) -> dict[str, Any]:
    """The keyword arguments of ``AIOKafkaProducer`` (and ``create_conn``) for *cfg*'s
    security settings; the password is revealed here and nowhere else."""
    settings: dict[str, Any] = {"security_protocol": cfg.security_protocol.value,
                                "ssl_context": cfg.ssl_context()}
    if cfg.security_protocol.uses_sasl:
        settings.update(sasl_mechanism=cfg.sasl_mechanism.value,
                        sasl_plain_username=cfg.sasl_username,
                        sasl_plain_password=cfg.sasl_password.reveal())
    return settings


def refusal(exc: BaseException) -> str | None:
    """Why the broker refuses us, if *exc* (or the error that caused it) says so: a
    certificate one side does not trust, credentials or a mechanism the broker rejects,
    missing authorization. None for anything else (a broker down, a timeout)."""
    for err in _chain(exc):
        if isinstance(err, REFUSALS):
            return type(err).__name__
        if isinstance(err, ssl.SSLCertVerificationError):
            words = getattr(err, "verify_message", None) or ssl_reason(err)
            return f"{type(err).__name__}: {words}"
        if isinstance(err, ssl.SSLError) and not isinstance(err, _TLS_BREAKS):
            return f"{type(err).__name__}: {ssl_reason(err)}"
        if isinstance(err, KeyError | ValueError) and _raised_by_sasl(err):
            return (f"SaslAuthenticationFailed: the broker ended the SASL exchange "
                    f"without accepting us ({type(err).__name__} {err})")
    return None


async def diagnose(cfg: KafkaConfig, request_timeout_ms: int) -> BaseException | None:
    """Connect to each bootstrap server as aiokafka does; the first refusal met, else the
    last error, else None (every server took the connection).

    A server that resets the connection is asked again, up to :data:`RESET_TRIES` times:
    with TLS 1.3 a broker rejects a client certificate only after the client's handshake
    has finished, and its alert is lost when the reset overtakes it (a quarter of the
    tries against stunnel)."""
    settings = client_security(cfg)
    last: BaseException | None = None
    for server in cfg.bootstrap_servers.split(","):
        host, _, port = server.strip().rpartition(":")
        for _ in range(RESET_TRIES):
            try:
                conn = await create_conn(host.strip("[]"), int(port), client_id=cfg.client_id,
                                         request_timeout_ms=request_timeout_ms, **settings)
            except Exception as exc:
                if refusal(exc) is not None:
                    return exc
                last = exc
                if not any(isinstance(err, ConnectionResetError) for err in _chain(exc)):
                    break
            else:
                conn.close()
                break
    return last


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    err: BaseException | None = exc
    while err is not None and err not in seen:
        seen.append(err)
        err = err.__cause__ or err.__context__
    return seen


def _raised_by_sasl(exc: BaseException) -> bool:
    """*exc* came out of one of aiokafka's SASL authenticators (parsing the server's
    answer), not from anywhere else."""
    return any("Authenticator" in frame.f_code.co_qualname
               and frame.f_code.co_filename.endswith(("aiokafka/conn.py", "aiokafka\\conn.py"))
               for frame, _ in traceback.walk_tb(exc.__traceback__))

