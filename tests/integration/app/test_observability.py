"""Observability on the real stack: /metrics from a running daemon, /readyz following
PostgreSQL, and every seed metric exported with its type and labels."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import psycopg
import pytest
import tomli_w
import trio
from prometheus_client.parser import text_string_to_metric_families

from actors.metrics_exporter import Readiness, serve_metrics_exporter
from supervision.db.database import open_database
from supervision.db.migrate import install_demo
from supervision.dev.kafka import KafkaServer
from supervision.dev.ports import free_ports
from supervision.dev.postgres import PostgresServer
from supervision.dev.s3 import S3Server
from supervision.tree.health import HEALTH
from tests.messenger import insert_call_session, insert_recording, upload_recording
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[3]

# name -> (type, label names); counters are listed by their family name (no _total)
SEED_METRICS = {
    "messenger_recording_finalize_backlog": ("gauge", set()),
    "messenger_recording_finalize_reconciled": ("counter", set()),
    "messenger_recording_finalize_failed": ("counter", set()),
    "messenger_recording_finalize_republished": ("counter", set()),
    "messenger_recording_finalize_quarantined": ("counter", set()),
    "messenger_recording_finalize_oldest_age_seconds": ("gauge", set()),
    "messenger_recording_finalize_run": ("counter", {"status"}),
    "messenger_recording_finalize_cycle_duration_seconds": ("histogram", set()),
    "safetynet_outbox_published": ("counter", set()),
    "safetynet_outbox_unpublished": ("gauge", set()),
    "safetynet_outbox_oldest_unpublished_age_seconds": ("gauge", set()),
    "safetynet_actor_restarts": ("counter", {"actor"}),
    "safetynet_lock_held": ("gauge", {"job"}),
}


def scrape(url: str) -> dict[str, tuple[str, dict[frozenset[tuple[str, str]], float]]]:
    text = httpx.get(f"{url}/metrics", timeout=5).text
    out = {}
    for family in text_string_to_metric_families(text):
        samples = {frozenset(s.labels.items()) | {("__name__", s.name)}: s.value
                   for s in family.samples}
        out[family.name] = (family.type, samples)
    return out


def value(metrics: dict[str, tuple[str, dict[frozenset[tuple[str, str]], float]]],
          name: str, sample: str | None = None, **labels: str) -> float:
    _, samples = metrics[name]
    want = {("__name__", sample or name), *labels.items()}
    return sum(v for k, v in samples.items() if want <= k)


def test_running_daemon_exports_every_seed_metric_and_counts_a_cycle(
        db_dsn: str, s3_server: S3Server, kafka_server: KafkaServer, bucket: str,
        tmp_path: Path) -> None:
    """Scrape a real `safetynet run`: each seed metric has its type and labels, and
    reconciled_total moves by exactly the rows one cycle reconciled."""
    port = free_ports(1)[0]
    creds = s3_server.credentials
    config = tmp_path / "c.toml"
    config.write_text(tomli_w.dumps({
        "postgres": {"dsn": db_dsn},
        "kafka": {"bootstrap_servers": kafka_server.bootstrap_servers},
        "s3": {"endpoint_url": s3_server.endpoint_url, "bucket": bucket,
               "access_key_id": creds.access_key_id,
               "secret_access_key": creds.secret_access_key},
        "jobs": {"recording_finalize": {"polling_interval": "1s"}},
        "http": {"listen": f"127.0.0.1:{port}"},
    }))
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        recs = [insert_recording(conn, session_id=insert_call_session(conn))
                for _ in range(3)]
    for rec in recs:
        upload_recording(s3_server, rec.id, bucket=bucket)
    log = (tmp_path / "daemon.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "supervision.app", "run", "-c", str(config)],
                            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                            env={"PATH": os.environ.get("PATH", "")})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _up(url), 20, "the metrics endpoint")
        wait_until(lambda: value(scrape(url), "messenger_recording_finalize_reconciled",
                                 "messenger_recording_finalize_reconciled_total") >= 3,
                   30, "the cycle to reconcile")
        wait_until(lambda: value(scrape(url), "safetynet_outbox_published",
                                 "safetynet_outbox_published_total") >= 3,
                   30, "the relay to publish")
        metrics = scrape(url)
        for name, (kind, labels) in SEED_METRICS.items():
            assert name in metrics, f"{name} is not exported"
            assert metrics[name][0] == kind, name
            for key in metrics[name][1]:
                got = {k for k, _ in key} - {"__name__", "le"}
                assert got == labels or not got, (name, got)
        assert value(metrics, "messenger_recording_finalize_reconciled",
                     "messenger_recording_finalize_reconciled_total") == 3
        assert value(metrics, "messenger_recording_finalize_run",
                     "messenger_recording_finalize_run_total", status="ok") >= 1
        assert httpx.get(f"{url}/healthz").status_code == 200
        ready = httpx.get(f"{url}/readyz")
        assert (ready.status_code, ready.text) == (200, "ready\n")
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
        log.close()


def _up(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


async def test_readyz_follows_postgres_down_and_back(own_stack_dir: Path) -> None:
    """/readyz is 503 with a one-line reason while PostgreSQL is stopped, 200 after."""
    server = PostgresServer(own_stack_dir)
    await trio.to_thread.run_sync(server.start)
    try:
        await trio.to_thread.run_sync(install_demo, server.dsn)
        async with open_database(server.dsn, size=1, connect_timeout=1) as db, \
                trio.open_nursery() as nursery:
            readiness = Readiness(lambda: db.run(lambda c: c.execute("SELECT 1")), cache_s=0)
            (listener, *_) = await nursery.start(serve_metrics_exporter, "127.0.0.1:0",
                                                 readiness)
            url = f"http://127.0.0.1:{listener.socket.getsockname()[1]}"
            async with httpx.AsyncClient() as client:
                # the pool connects in the background: ready once it has
                await trio.to_thread.run_sync(_wait_ready, url, 20)
                await trio.to_thread.run_sync(server.stop)
                down = await client.get(f"{url}/readyz", timeout=10)
                assert down.status_code == 503
                assert down.text.startswith("not ready: postgres unavailable")
                assert down.text.count("\n") == 1
                await trio.to_thread.run_sync(server.start)
                await trio.to_thread.run_sync(_wait_ready, url, 20)
            nursery.cancel_scope.cancel()
    finally:
        await trio.to_thread.run_sync(server.stop)


def _ready(url: str) -> bool:
    return httpx.get(f"{url}/readyz", timeout=5).status_code == 200


def _wait_ready(url: str, limit_s: float) -> None:
    """Wait for /readyz 200; a failure names the last answer (which component, why)."""
    try:
        wait_until(lambda: _ready(url), limit_s, "readiness", step_s=0.1)
    except AssertionError as exc:
        answer = httpx.get(f"{url}/readyz", timeout=5)
        raise AssertionError(f"{exc}; last /readyz: {answer.status_code} {answer.text!r}"
                             ) from None


async def test_config_fault_makes_readyz_503_until_cleared() -> None:
    """A configuration fault (missing bucket) turns readiness off with its reason."""
    async def ok() -> None:
        return None

    async with trio.open_nursery() as nursery:
        (listener, *_) = await nursery.start(serve_metrics_exporter, "127.0.0.1:0",
                                             Readiness(ok, cache_s=0))
        url = f"http://127.0.0.1:{listener.socket.getsockname()[1]}"
        async with httpx.AsyncClient() as client:
            HEALTH.set_fault("s3", "bucket_missing")
            try:
                resp = await client.get(f"{url}/readyz")
                assert (resp.status_code, resp.text) == (
                    503, "not ready: configuration fault in s3: bucket_missing\n")
            finally:
                HEALTH.clear_fault("s3")
            assert (await client.get(f"{url}/readyz")).status_code == 200
        nursery.cancel_scope.cancel()


async def test_slow_scraper_does_not_block_other_requests() -> None:
    """A client that connects and never sends a request holds only its own socket."""
    async def ok() -> None:
        return None

    async with trio.open_nursery() as nursery:
        (listener, *_) = await nursery.start(serve_metrics_exporter, "127.0.0.1:0",
                                             Readiness(ok))
        port = listener.socket.getsockname()[1]
        stuck = [await trio.open_tcp_stream("127.0.0.1", port) for _ in range(5)]
        await stuck[0].send_all(b"GET /metr")  # a partial request, never finished
        async with httpx.AsyncClient() as client:
            with trio.fail_after(2):
                resp = await client.get(f"http://127.0.0.1:{port}/metrics")
        assert resp.status_code == 200
        assert "safetynet_actor_restarts" in resp.text
        for s in stuck:
            await s.aclose()
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize(("path", "status"), [("/nope", 404), ("/metrics?x=1", 200)])
async def test_unknown_paths_are_404_and_queries_are_ignored(path: str, status: int) -> None:
    """Routing is exact on the path."""
    async def ok() -> None:
        return None

    async with trio.open_nursery() as nursery:
        (listener, *_) = await nursery.start(serve_metrics_exporter, "127.0.0.1:0",
                                             Readiness(ok))
        url = f"http://127.0.0.1:{listener.socket.getsockname()[1]}{path}"
        async with httpx.AsyncClient() as client:
            assert (await client.get(url)).status_code == status
        nursery.cancel_scope.cancel()
