"""Traces: a span per cycle and a child span per row, with the seed's attributes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psycopg
import tomli_w
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from actors.finalize.cycle import run_finalize_cycle
from actors.leases.lock_keeper import CycleContext
from actors.tracing import configure_tracing
from supervision.app.daemon import open_resources
from supervision.app.tree import finalize_job
from supervision.config import TracingConfig
from supervision.dev.ports import free_ports
from supervision.dev.s3 import S3Server
from tests.conftest import make_config
from tests.messenger import insert_call_session, insert_recording, upload_recording
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[3]



EXPORTER = InMemorySpanExporter()
configure_tracing(TracingConfig(), exporter=EXPORTER)


async def test_cycle_span_has_one_child_span_per_row(
        db_dsn: str, s3_server: S3Server, bucket: str) -> None:
    """The cycle span carries job_run_id and counts; each row's span its RecordingId,
    phase, attempts and tenant, and is a child of the cycle span."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        found = insert_recording(conn, session_id=insert_call_session(conn))
        missing = insert_recording(conn, session_id=insert_call_session(conn))
    upload_recording(s3_server, found.id, bucket=bucket)
    EXPORTER.clear()
    run_id = str(uuid.uuid4())
    cfg = make_config(db_dsn, s3_server=s3_server, bucket=bucket)
    async with open_resources(cfg) as res:
        await run_finalize_cycle(finalize_job(res), CycleContext("recording-finalize", run_id))
    spans = EXPORTER.get_finished_spans()
    (cycle,) = [s for s in spans if s.name == "recording-finalize.cycle"]
    rows = [s for s in spans if s.name == "recording-finalize.row"]
    assert cycle.attributes is not None
    assert cycle.attributes["job_run_id"] == run_id
    assert cycle.attributes["reconciled"] == 1 and cycle.attributes["failed"] == 1
    assert {s.attributes["recording_id"] for s in rows if s.attributes} == {found.id, missing.id}
    for row in rows:
        assert row.parent is not None and row.parent.span_id == cycle.context.span_id
        assert row.attributes is not None
        assert row.attributes["phase"] == "reconcile" and row.attributes["attempts"] == 1
        assert "tenant_id" in row.attributes


def test_daemon_exports_spans_to_the_configured_otlp_endpoint(
        db_dsn: str, s3_server: S3Server, bucket: str, tmp_path: Path) -> None:
    """With [tracing] endpoint set, a real `safetynet run` POSTs OTLP/HTTP protobuf spans
    to it (flushed at the latest when it stops)."""
    received: list[tuple[str, str, int]] = []

    class Collector(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            received.append((self.path, self.headers.get("content-type", ""), len(body)))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Collector)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    creds = s3_server.credentials
    config = tmp_path / "c.toml"
    config.write_text(tomli_w.dumps({
        "postgres": {"dsn": db_dsn},
        "s3": {"endpoint_url": s3_server.endpoint_url, "bucket": bucket,
               "access_key_id": creds.access_key_id,
               "secret_access_key": creds.secret_access_key},
        "jobs": {"recording_finalize": {"polling_interval": "1s"}},
        "outbox_relay": {"enabled": False},
        "http": {"listen": f"127.0.0.1:{free_ports(1)[0]}"},
        "tracing": {"endpoint": f"http://127.0.0.1:{server.server_port}/v1/traces"},
    }))
    log = (tmp_path / "daemon.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "supervision.app", "run", "-c", str(config)],
                            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                            env={"PATH": os.environ.get("PATH", "")})
    try:
        wait_until(lambda: b"cycle_completed" in (tmp_path / "daemon.log").read_bytes(), 30,
                   "a cycle")
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=20)
        log.close()
        server.shutdown()
    assert code == 0
    assert received, "no OTLP export reached the collector"
    path, content_type, size = received[0]
    assert path == "/v1/traces" and content_type == "application/x-protobuf" and size > 0
