"""The recorder stop signal over HTTPS to a media stack whose certificate a private CA
signed (``media.ca_file``): a real TLS server on loopback, real PostgreSQL."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import psycopg
import pytest
import structlog
from prometheus_client import REGISTRY

from actors.leases.lock_keeper import CycleContext
from actors.reaper.cycle import ReaperCounts, ReaperJob, run_reaper_cycle
from actors.reaper.recorder_signal import open_media_client
from supervision.app.settings import Config
from supervision.db.database import open_database
from supervision.tree.health import HEALTH
from tests.conftest import make_config
from tests.media_stub import MediaStub, serve_media_stub
from tests.messenger import (
    conference_statuses,
    insert_conference,
    insert_conference_recording,
    outbox_rows,
)
from tests.pki import PrivateCa

TOKEN = "media-bearer-token"


@pytest.fixture
def conn(db_dsn: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(db_dsn, autocommit=True) as c:
        yield c


@pytest.fixture(autouse=True)
def media_fault_cleared() -> Iterator[None]:
    yield
    HEALTH.clear_fault("media")


@pytest.fixture
def https_media(private_ca: PrivateCa) -> Iterator[MediaStub]:
    """The media stand-in over HTTPS, its certificate signed by the private CA."""
    with serve_media_stub(private_ca.server_context()) as stub:
        yield stub


async def run_cycle(cfg: Config) -> ReaperCounts:
    async with open_database(cfg.postgres.dsn.reveal(), size=2) as db, \
            open_media_client(cfg.media) as http:
        job = ReaperJob(cfg.jobs.conference_reaper, cfg.media, db, http)
        return await run_reaper_cycle(job, CycleContext("conference-reaper", str(uuid.uuid4())))


def tls_failures() -> float:
    return REGISTRY.get_sample_value("safetynet_recorder_stop_failed_total",
                                     {"reason": "tls"}) or 0.0


async def test_stop_signal_reaches_the_media_api_over_https_trusting_the_private_ca(
        db_dsn: str, conn: psycopg.Connection, https_media: MediaStub,
        private_ca: PrivateCa) -> None:
    """With media.ca_file naming the private CA, the stop goes out over HTTPS with its
    bearer token and is done; nothing is counted as failed."""
    assert https_media.base_url.startswith("https://")
    cfg = make_config(db_dsn, media={"base_url": https_media.base_url, "token": TOKEN,
                                     "ca_file": str(private_ca.ca_file)})
    conf = insert_conference(conn, last_activity_ago=120)
    rid = insert_conference_recording(conn, conf, status="Recording")
    before = tls_failures()
    with structlog.testing.capture_logs() as logs:
        counts = await run_cycle(cfg)
    assert counts.empty_timeout == 1
    (stop,) = https_media.stops_for(rid)
    assert stop.headers["authorization"] == f"Bearer {TOKEN}"
    assert [e["status"] for e in logs if e["event"] == "recorder_stop_sent"] == ["200"]
    assert tls_failures() == before and HEALTH.reason() is None


@pytest.mark.parametrize("trusted", ["stranger_ca", "public_cas"])
async def test_untrusted_media_certificate_is_a_tls_fault_never_a_wrong_verdict(
        db_dsn: str, conn: psycopg.Connection, https_media: MediaStub,
        private_ca: PrivateCa, stranger_ca: PrivateCa, trusted: str) -> None:
    """media.ca_file names a CA that did not sign the media stack's certificate (or is
    empty: certifi's public CAs): the handshake is refused, no request (and no token)
    reaches the server, the failure is logged and counted as `tls`, and the cycle still
    ends the room with its event: the verdict does not depend on the signal. It is a
    configuration fault (readiness names it) until a stop gets through again."""
    ca_file = str(stranger_ca.ca_file) if trusted == "stranger_ca" else ""
    cfg = make_config(db_dsn, media={"base_url": https_media.base_url, "token": TOKEN,
                                     "ca_file": ca_file})
    conf = insert_conference(conn, last_activity_ago=120)
    rid = insert_conference_recording(conn, conf, status="Recording")
    before = tls_failures()
    with structlog.testing.capture_logs() as logs:
        counts = await run_cycle(cfg)
    assert counts.empty_timeout == 1 and counts.errors == 0
    assert conference_statuses(conn)[conf.id] == ("Ended", "EmptyTimeout")
    assert len(outbox_rows(conn, conf.id)) == 1
    assert https_media.requests == []
    (failure,) = [e for e in logs if e["event"] == "recorder_stop_failed"]
    assert failure["recording_id"] == rid
    assert failure["error"] == "tls:CERTIFICATE_VERIFY_FAILED"
    assert tls_failures() == before + 1
    assert TOKEN not in json.dumps(logs, default=str)
    assert HEALTH.reason() == ("configuration fault in media: tls: CERTIFICATE_VERIFY_FAILED"
                               " (check media.ca_file)")
    fixed = make_config(db_dsn, media={"base_url": https_media.base_url,
                                       "ca_file": str(private_ca.ca_file)})
    insert_conference_recording(conn, insert_conference(conn, last_activity_ago=120))
    await run_cycle(fixed)
    assert HEALTH.reason() is None and len(https_media.requests) == 1
