"""Traces: a span per cycle and a child span per row, with the seed's attributes."""

from __future__ import annotations

import uuid

import psycopg
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from actors.lock_keeper import CycleContext
from actors.recording_finalize import run_finalize_cycle
from supervision.app import open_resources
from supervision.config import TracingConfig
from supervision.devstack import S3Server
from supervision.tracing import configure_tracing
from supervision.tree import finalize_job
from tests.conftest import make_config
from tests.messenger import insert_call_session, insert_recording, upload_recording

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
