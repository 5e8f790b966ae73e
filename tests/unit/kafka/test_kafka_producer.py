"""Kafka errors sorted by who must act: retry (transient), dead-letter (the message),
or a configuration fault (the operator) — nothing is dead-lettered for the latter."""

from __future__ import annotations

import asyncio
import ssl
from typing import Any, ClassVar

import pytest
from aiokafka import errors
from aiokafka.conn import ScramAuthenticator
from aiokafka.helpers import create_ssl_context as aiokafka_helpers_create_ssl_context
from aiokafka.partitioner import DefaultPartitioner

from actors.kafka import producer as kafka_producer
from actors.kafka.producer import Delivery, KafkaProducer, classify, probe_verdict
from actors.kafka.security import refusal
from supervision.app.settings import config_from_dict
from supervision.errors import ConfigError
from tests.tls_terminator import Pki, make_pki


@pytest.mark.parametrize("exc", [
    errors.TopicAuthorizationFailedError("t"), errors.ClusterAuthorizationFailedError(),
    errors.SaslAuthenticationFailed(), errors.AuthenticationFailedError(),
    errors.UnsupportedSaslMechanismError(), errors.IllegalSaslStateError(),
    errors.AuthenticationMethodNotSupported(),
])
def test_authorization_and_sasl_errors_are_configuration_faults(exc: Exception) -> None:
    """The broker refuses us: not the row's fault, never a dead letter."""
    assert classify(exc) is Delivery.FAULT


@pytest.mark.parametrize("exc", [errors.MessageSizeTooLargeError(),
                                 errors.InvalidTopicError()])
def test_a_message_the_broker_can_never_take_is_rejected(exc: Exception) -> None:
    assert classify(exc) is Delivery.REJECTED


@pytest.mark.parametrize("exc", [
    errors.KafkaTimeoutError(), errors.KafkaConnectionError(), errors.NotLeaderForPartitionError(),
    errors.RequestTimedOutError(),
    # after aiokafka's metadata wait timed out: a dead broker gives it too
    errors.UnknownTopicOrPartitionError(),
])
def test_infrastructure_errors_are_transient(exc: Exception) -> None:
    assert classify(exc) is Delivery.TRANSIENT


@pytest.mark.parametrize(("code", "delivery"), [
    (0, None),  # the topic exists
    (5, None),  # LEADER_NOT_AVAILABLE: being created, the send waits for it
    (3, Delivery.FAULT),  # UNKNOWN_TOPIC_OR_PARTITION from the broker: auto-create off
    (29, Delivery.FAULT),  # TOPIC_AUTHORIZATION_FAILED
    (31, Delivery.FAULT),  # CLUSTER_AUTHORIZATION_FAILED
    (17, Delivery.REJECTED),  # INVALID_TOPIC_EXCEPTION
    (7, Delivery.TRANSIENT),  # REQUEST_TIMED_OUT
])
def test_topic_probe_answer_decides_before_any_send(code: int,
                                                   delivery: Delivery | None) -> None:
    """The broker's own answer to the Metadata probe is unambiguous, unlike a timeout."""
    assert probe_verdict(code) is delivery


# --------------------------------------------------------------------------- security


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


class RecordingProducer:
    """Stands in for AIOKafkaProducer: keeps the keyword arguments it was built with."""

    built: ClassVar[list[dict[str, Any]]] = []

    def __init__(self, **kwargs: Any) -> None:
        self.built.append(kwargs)

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass


def aiokafka_kwargs(monkeypatch: pytest.MonkeyPatch, kafka: dict[str, Any]
                    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """What AIOKafkaProducer receives from a started KafkaProducer for *kafka*, and the
    arguments aiokafka's create_ssl_context was called with."""
    contexts: list[dict[str, Any]] = []

    def spy(**kwargs: Any) -> ssl.SSLContext:
        contexts.append(kwargs)
        return aiokafka_helpers_create_ssl_context(**kwargs)

    cfg = config_from_dict({"postgres": {"dsn": "postgresql://u@db/m?sslmode=verify-full"},
                            "kafka": kafka})
    monkeypatch.setattr(kafka_producer, "AIOKafkaProducer", RecordingProducer)
    monkeypatch.setattr("aiokafka.helpers.create_ssl_context", spy)
    RecordingProducer.built.clear()
    asyncio.run(KafkaProducer(cfg.kafka)._start())
    [kwargs] = RecordingProducer.built
    return kwargs, contexts


def test_plaintext_producer_gets_no_tls_and_no_sasl(monkeypatch: pytest.MonkeyPatch) -> None:
    kwargs, contexts = aiokafka_kwargs(monkeypatch, {})
    assert kwargs["security_protocol"] == "PLAINTEXT" and kwargs["ssl_context"] is None
    assert not {k for k in kwargs if k.startswith("sasl")}
    assert contexts == []


def test_ssl_producer_verifies_the_broker_with_the_configured_ca(
        monkeypatch: pytest.MonkeyPatch, pki: Pki) -> None:
    """SSL: a context that requires the broker's certificate and host name, trusting
    exactly ssl_cafile; no SASL settings."""
    kwargs, contexts = aiokafka_kwargs(
        monkeypatch, {"security_protocol": "SSL", "ssl_cafile": str(pki.ca)})
    context = kwargs["ssl_context"]
    assert kwargs["security_protocol"] == "SSL" and isinstance(context, ssl.SSLContext)
    assert context.verify_mode is ssl.CERT_REQUIRED and context.check_hostname
    assert [c["subject"] for c in context.get_ca_certs()] == [
        c["subject"] for c in ssl.create_default_context(cafile=pki.ca).get_ca_certs()]
    assert not {k for k in kwargs if k.startswith("sasl")}
    assert [(c["cafile"], c["certfile"], c["keyfile"]) for c in contexts] == [
        (str(pki.ca), None, None)]


def test_mutual_tls_producer_loads_the_client_certificate_and_key(
        monkeypatch: pytest.MonkeyPatch, pki: Pki) -> None:
    kwargs, contexts = aiokafka_kwargs(monkeypatch, {
        "security_protocol": "SSL", "ssl_cafile": str(pki.ca),
        "ssl_certfile": str(pki.client_cert), "ssl_keyfile": str(pki.client_key)})
    assert isinstance(kwargs["ssl_context"], ssl.SSLContext)
    assert [(c["cafile"], c["certfile"], c["keyfile"]) for c in contexts] == [
        (str(pki.ca), str(pki.client_cert), str(pki.client_key))]


@pytest.mark.parametrize(("protocol", "mechanism", "tls"), [
    ("SASL_SSL", "SCRAM-SHA-512", True),
    ("SASL_SSL", "PLAIN", True),
    ("SASL_PLAINTEXT", "SCRAM-SHA-256", False),
])
def test_sasl_producer_gets_mechanism_user_and_revealed_password(
        monkeypatch: pytest.MonkeyPatch, protocol: str, mechanism: str, tls: bool) -> None:
    """The SASL settings reach aiokafka exactly, the password as the plain string (the
    Secret is revealed only there); TLS only for SASL_SSL (system trust store)."""
    kwargs, contexts = aiokafka_kwargs(monkeypatch, {
        "security_protocol": protocol, "sasl_mechanism": mechanism,
        "sasl_username": "relay", "sasl_password": "pw-1234"})
    assert {k: v for k, v in kwargs.items() if k.startswith(("sasl", "security"))} == {
        "security_protocol": protocol, "sasl_mechanism": mechanism,
        "sasl_plain_username": "relay", "sasl_plain_password": "pw-1234"}
    assert isinstance(kwargs["ssl_context"], ssl.SSLContext) is tls
    assert [c["cafile"] for c in contexts] == ([None] if tls else [])


def scram_failure(server_final: str) -> Exception:
    """What aiokafka's SCRAM authenticator raises on *server_final* (RFC 5802)."""
    auth = ScramAuthenticator(loop=None, sasl_plain_password="pw",
                              sasl_plain_username="u", sasl_mechanism="SCRAM-SHA-512")
    try:
        auth.process_server_final_message(server_final)
    except (KeyError, ValueError) as exc:
        return exc
    raise AssertionError("the authenticator accepted the message")


def caused(exc: Exception, cause: BaseException) -> Exception:
    exc.__cause__ = cause
    return exc


@pytest.mark.parametrize(("exc", "reason"), [
    (ssl.SSLCertVerificationError(1, "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify "
                                  "failed (_ssl.c:1006)"), "SSLCertVerificationError"),
    (caused(errors.KafkaConnectionError("Connection at x closed"), ssl.SSLError(
        1, "[SSL: TLSV1_ALERT_UNKNOWN_CA] tlsv1 alert unknown ca (_ssl.c:2580)")),
     "SSLError: tlsv1 alert unknown ca"),
    (scram_failure("e=unknown-user"), "SaslAuthenticationFailed"),  # KeyError('v')
    (scram_failure("v=bm90IHRoZSBzaWduYXR1cmU="), "SaslAuthenticationFailed"),  # ValueError
    (errors.SaslAuthenticationFailed(), "SaslAuthenticationFailed"),
])
def test_a_refused_connection_is_a_configuration_fault(exc: Exception, reason: str) -> None:
    """What aiokafka raises when the broker will not have us (TLS trust, SCRAM, SASL)."""
    assert (refusal(exc) or "").startswith(reason)
    assert classify(exc) is Delivery.FAULT


@pytest.mark.parametrize("exc", [
    errors.KafkaConnectionError("Unable to bootstrap from [...]"),
    caused(errors.KafkaConnectionError("closed"), ssl.SSLEOFError(8, "EOF occurred")),
    KeyError("v"),  # the same error, but not from the SASL exchange
    ConnectionRefusedError(111, "Connection refused"),
])
def test_a_broken_connection_is_not_a_refusal(exc: Exception) -> None:
    assert refusal(exc) is None
    assert classify(exc) is Delivery.TRANSIENT


def test_key_partitioner_puts_every_key_where_aiokafka_and_the_java_client_do() -> None:
    """The remembered hashes change nothing: each key (asked twice, the second time from
    the cache) gets aiokafka's DefaultPartitioner partition at every partition count."""
    default = DefaultPartitioner()
    keys = [f"{n:08x}-5a8e-4222-8333-444455556666".encode() for n in range(300)] + [b"", b"k"]
    for count in (1, 3, 7, 12):
        partitions = list(range(count))
        for key in keys + keys:
            assert kafka_producer.key_partitioner(key, partitions, partitions) == default(
                key, partitions, partitions), (key, count)
    # the Java client's partitions for these keys at 1,000 partitions (kafka-python's
    # compatibility vectors)
    java = {b"": 681, b"a": 524, b"ab": 434, b"abc": 107, b"123456789": 566, b"\x00 ": 742}
    partitions = list(range(1000))
    assert {key: kafka_producer.key_partitioner(key, partitions, partitions)
            for key in java} == java


def test_key_partitioner_spreads_keyless_messages_over_available_partitions() -> None:
    picked = {kafka_producer.key_partitioner(None, [0, 1, 2, 3], [1, 3]) for _ in range(200)}
    assert picked == {1, 3}


# --------------------------------------------------------------------------- acks


def test_the_producer_waits_for_every_in_sync_replica_without_idempotence_by_default(
        monkeypatch: pytest.MonkeyPatch) -> None:
    kwargs, _ = aiokafka_kwargs(monkeypatch, {})
    assert (kwargs["acks"], kwargs["enable_idempotence"]) == ("all", False)


def test_acks_1_and_idempotence_reach_aiokafka_as_set(monkeypatch: pytest.MonkeyPatch) -> None:
    """aiokafka takes the leader-only setting as the integer 1 (it refuses "1")."""
    kwargs, _ = aiokafka_kwargs(monkeypatch, {"acks": "1"})
    assert kwargs["acks"] == 1
    kwargs, _ = aiokafka_kwargs(monkeypatch, {"enable_idempotence": True})
    assert (kwargs["acks"], kwargs["enable_idempotence"]) == ("all", True)


@pytest.mark.parametrize(("kafka", "named"), [
    ({"acks": "0"}, "kafka.acks"),
    ({"acks": "1", "enable_idempotence": True}, "kafka.enable_idempotence: needs acks"),
])
def test_acks_without_an_acknowledgement_or_idempotence_without_all_are_refused(
        kafka: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigError) as raised:
        config_from_dict({"postgres": {"dsn": "postgresql://u@db/m?sslmode=verify-full"},
                          "kafka": kafka})
    assert named in str(raised.value)
