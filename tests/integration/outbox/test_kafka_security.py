"""The outbox relay against Kafka over TLS (Tansu behind stunnel, a throwaway CA), with
mutual TLS, and against Tansu requiring SASL: what publishes, and what the broker refuses
(a configuration fault: readiness 503, nothing dead-lettered, rows untouched)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
import trio
from aiokafka.helpers import create_ssl_context

from actors.leases.lock_keeper import CycleContext
from actors.outbox.relay import run_relay_cycle
from supervision.app.daemon import open_resources, run_once
from supervision.app.settings import Config
from supervision.app.tree import relay_job
from supervision.dev.kafka import KafkaServer
from supervision.errors import ConfigurationFault
from supervision.tree.health import HEALTH
from tests.conftest import make_config
from tests.integration.outbox.test_outbox_relay import (
    dead_letters,
    enqueue,
    outbox_by_event_id,
    unpublished,
)
from tests.logscan import KNOWN_SECRETS
from tests.messenger import read_topic
from tests.tls_terminator import Pki, TlsKafka, make_pki, open_tls_kafka, stunnel

SASL_PASSWORD = "sasl-pw-never-logged"
KNOWN_SECRETS.add(SASL_PASSWORD)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def tls_kafka(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[TlsKafka]:
    with open_tls_kafka(tmp_path_factory.mktemp("tls-kafka"), pki) as kafka:
        yield kafka


@pytest.fixture(scope="module")
def mtls_kafka(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[TlsKafka]:
    """The terminator demands a client certificate signed by the throwaway CA."""
    with open_tls_kafka(tmp_path_factory.mktemp("mtls-kafka"), pki, client_ca=pki.ca) as kafka:
        yield kafka


@pytest.fixture
def topic() -> str:
    return f"test.secure.{uuid.uuid4().hex[:10]}"


@pytest.fixture(autouse=True)
def clear_kafka_fault() -> Iterator[None]:
    yield
    HEALTH.clear_fault("kafka")


def tls_config(db_dsn: str, kafka: TlsKafka, **kafka_keys: Any) -> Config:
    return make_config(db_dsn, kafka={"bootstrap_servers": kafka.bootstrap_servers,
                                      "security_protocol": "SSL", **kafka_keys})


async def read_tls(kafka: TlsKafka, pki: Pki, topic: str, expect: int) -> list[Any]:
    context = create_ssl_context(cafile=str(pki.ca), certfile=str(pki.client_cert),
                                 keyfile=str(pki.client_key))
    return await trio.to_thread.run_sync(lambda: read_topic(
        kafka.bootstrap_servers, topic, expect=expect, timeout=15,
        security_protocol="SSL", ssl_context=context))


async def assert_refused_as_configuration_fault(cfg: Config, db_dsn: str, ids: list[int],
                                                reason: str) -> None:
    """The relay's cycle ends normally (no crash, so no restart loop), logs
    ``config_fault``, readiness names *reason*; no row is dead-lettered or charged an
    attempt; run-once fails with a ConfigurationFault. The next try, after the back-off,
    is refused the same way."""
    async with open_resources(cfg) as res:
        job = relay_job(res)
        for attempt in ("t1", "t2"):
            with structlog.testing.capture_logs() as logs:
                counts = await run_relay_cycle(job, CycleContext("outbox-relay", attempt))
            assert (counts.published, counts.failed) == (0, 0)
            faults = [e for e in logs if e["event"] == "config_fault"]
            assert [(e["component"], e["log_level"]) for e in faults] == [("kafka", "error")]
            assert reason in faults[0]["error"]
            assert not any(e["event"] == "kafka_unavailable" for e in logs)
            health = HEALTH.reason()
            assert health is not None and health.startswith(
                "configuration fault in kafka: broker refused the connection:")
            assert reason in health
            await trio.sleep_until(job.state.kafka_retry_at)  # the Kafka-wide back-off
    rows = await trio.to_thread.run_sync(unpublished, db_dsn)
    assert [r["id"] for r in rows] == ids
    assert {(r["publish_attempts"], r["last_error"]) for r in rows} == {(0, None)}
    assert await trio.to_thread.run_sync(dead_letters, db_dsn) == {}
    with pytest.RaisesGroup(pytest.RaisesExc(ConfigurationFault, match=reason),
                            flatten_subgroups=True):
        await run_once(cfg, "outbox-relay")


async def test_relay_publishes_through_tls_trusting_the_private_ca(
        db_dsn: str, tls_kafka: TlsKafka, pki: Pki, topic: str) -> None:
    """With ssl_cafile = the throwaway CA, every row goes out over TLS (bootstrap and the
    advertised broker alike) and is read back through TLS."""
    cfg = tls_config(db_dsn, tls_kafka, ssl_cafile=str(pki.ca))
    ids = await trio.to_thread.run_sync(enqueue, db_dsn, topic, ["a", "b", "a"])
    counts = await run_once(cfg, "outbox-relay")
    assert (counts["published"], counts["failed"]) == (3, 0)
    messages = await read_tls(tls_kafka, pki, topic, expect=3)
    by_event = await trio.to_thread.run_sync(outbox_by_event_id, db_dsn)
    assert [by_event[m.headers["event-id"]] for m in messages] == ids
    assert await trio.to_thread.run_sync(unpublished, db_dsn) == []
    assert HEALTH.reason() is None


async def test_broker_certificate_signed_by_another_ca_is_a_configuration_fault(
        db_dsn: str, tls_kafka: TlsKafka, pki: Pki, topic: str) -> None:
    """A CA that did not sign the broker's certificate: the handshake fails certificate
    verification, which aiokafka's start() hides behind "Unable to bootstrap"; the relay
    finds the real error and reports a configuration fault, not an outage."""
    cfg = tls_config(db_dsn, tls_kafka, ssl_cafile=str(pki.other_ca))
    ids = await trio.to_thread.run_sync(enqueue, db_dsn, topic, ["a", "b"])
    await assert_refused_as_configuration_fault(cfg, db_dsn, ids, "SSLCertVerificationError")


async def test_relay_publishes_with_a_client_certificate_the_broker_requires(
        db_dsn: str, mtls_kafka: TlsKafka, pki: Pki, topic: str) -> None:
    """Mutual TLS: ssl_certfile/ssl_keyfile reach the handshake and the broker (stunnel
    with requireCert) lets the relay in."""
    cfg = tls_config(db_dsn, mtls_kafka, ssl_cafile=str(pki.ca),
                     ssl_certfile=str(pki.client_cert), ssl_keyfile=str(pki.client_key))
    await trio.to_thread.run_sync(enqueue, db_dsn, topic, ["a"])
    counts = await run_once(cfg, "outbox-relay")
    assert counts["published"] == 1
    assert len(await read_tls(mtls_kafka, pki, topic, expect=1)) == 1


async def test_missing_client_certificate_is_a_configuration_fault(
        db_dsn: str, mtls_kafka: TlsKafka, pki: Pki, topic: str) -> None:
    """A broker that requires a client certificate and gets none refuses with a TLS
    alert (seen by aiokafka as a closed connection caused by an SSLError)."""
    cfg = tls_config(db_dsn, mtls_kafka, ssl_cafile=str(pki.ca))
    ids = await trio.to_thread.run_sync(enqueue, db_dsn, topic, ["a"])
    await assert_refused_as_configuration_fault(cfg, db_dsn, ids, "certificate required")


@pytest.fixture
def sasl_broker(tmp_path: Path, pki: Pki, request: pytest.FixtureRequest
                ) -> Iterator[tuple[str, dict[str, Any]]]:
    """Tansu with --authentication, plain or behind the TLS terminator: the bootstrap
    servers and the [kafka] keys that reach it."""
    keys = {"sasl_mechanism": "SCRAM-SHA-512", "sasl_username": "safetynet",
            "sasl_password": SASL_PASSWORD}
    if request.param == "SASL_SSL":
        stunnel()
        with open_tls_kafka(tmp_path, pki, authentication=True) as kafka:
            yield kafka.bootstrap_servers, {**keys, "security_protocol": "SASL_SSL",
                                            "ssl_cafile": str(pki.ca)}
        return
    broker = KafkaServer(tmp_path, authentication=True)
    broker.start()
    try:
        yield broker.bootstrap_servers, {**keys, "security_protocol": "SASL_PLAINTEXT"}
    finally:
        broker.stop()


@pytest.mark.parametrize("sasl_broker", ["SASL_PLAINTEXT", "SASL_SSL"], indirect=True)
async def test_sasl_credentials_the_broker_rejects_are_a_configuration_fault(
        db_dsn: str, sasl_broker: tuple[str, dict[str, Any]], topic: str) -> None:
    """Tansu 0.6 with --authentication knows no SCRAM user, so it rejects ours: its
    server-final message carries no signature and aiokafka fails with a bare
    KeyError('v'). That is classified as a SASL refusal: a configuration fault, never
    an outage or a crash; the password shows up in no log line."""
    bootstrap, keys = sasl_broker
    cfg = make_config(db_dsn, kafka={"bootstrap_servers": bootstrap, **keys})
    ids = await trio.to_thread.run_sync(enqueue, db_dsn, topic, ["a", "b"])
    await assert_refused_as_configuration_fault(cfg, db_dsn, ids, "SaslAuthenticationFailed")
