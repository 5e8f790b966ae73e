"""recording-finalize under object-storage faults: real PostgreSQL, real SeaweedFS behind the
fault proxy (``s3.endpoint_url`` = the proxy). The seed's transient/poison/parallel/
cancellation rows of its test table, and SPEC §3's outcome classes, end to end."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
import trio
from prometheus_client import REGISTRY

from actors.finalize.cycle import JOB, run_finalize_cycle
from actors.finalize.queries import FINALIZE_QUERIES
from actors.finalize.reconciler import pool_size
from actors.finalize.state import FinalizeCounts
from actors.leases.lock_keeper import CycleContext
from actors.s3.process import RESPAWN_INTERVAL, WorkerObjectStore
from supervision.app.daemon import open_resources
from supervision.app.settings import Config
from supervision.app.tree import finalize_job
from supervision.dev.s3 import S3Server
from supervision.tree.health import HEALTH
from tests.conftest import make_config
from tests.faults import (
    SLOW_DOWN,
    FaultProxy,
    HttpRequest,
    HttpRule,
    put_recordings,
    s3_object,
    s3_proxy_fixture,  # noqa: F401
)
from tests.integration.finalize.test_recording_finalize import counts_of, run_cycle
from tests.messenger import (
    PREFIX,
    attempt,
    db_now,
    fetch,
    insert_call_session,
    insert_recording,
    outbox_rows,
    realtime_rows,
    recording,
    skip_backoff,
    upload_recording,
)

FAST_BACKOFF = {"backoff_base": "50ms", "backoff_cap": "200ms", "max_attempts": 8}


@pytest.fixture
def conn(db_dsn: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(db_dsn, autocommit=True) as c:
        yield c


@pytest.fixture
def clean_health() -> Iterator[None]:
    yield
    HEALTH.clear_fault("s3")


def proxied(db_dsn: str, s3_server: S3Server, bucket: str, proxy: FaultProxy, *,
            s3: dict[str, Any] | None = None, **finalize: Any) -> Config:
    """The test config with object storage reached through *proxy*."""
    return make_config(db_dsn, s3_server=s3_server, bucket=bucket,
                       s3={"endpoint_url": proxy.url, **(s3 or {})},
                       jobs={"recording_finalize": finalize})


def breaker_gauge() -> float | None:
    return REGISTRY.get_sample_value("safetynet_s3_breaker_open")


def worker_starts() -> float:
    return REGISTRY.get_sample_value("safetynet_s3_worker_starts_total") or 0.0


def heads_of(recording_ids: list[str]) -> Callable[[HttpRequest], bool]:
    """HEADs of these recordings' objects only: never the bucket HEAD (nor any other key a
    probe might use), so the cycle still starts and claims."""
    return s3_object("HEAD", keys={f"{PREFIX}{rid}" for rid in recording_ids})


def stuck_recordings(conn: psycopg.Connection, count: int, **kwargs: Any) -> list[str]:
    """*count* Uploading recordings of one long-ended call, each with a due finalize row."""
    sid = insert_call_session(conn, ended_ago=3600)
    return [insert_recording(conn, session_id=sid, **kwargs).id for _ in range(count)]


def attempts_by_recording(conn: psycopg.Connection) -> dict[str, dict[str, Any]]:
    rows = fetch(conn, "SELECT * FROM messenger.recording_finalize_attempts")
    return {str(r["recording_id"]): r for r in rows}


def make_due(conn: psycopg.Connection, attempt_id: str | None) -> None:
    conn.execute("UPDATE messenger.recording_finalize_attempts"
                 " SET next_attempt_at = now() - interval '1 second' WHERE id = %s",
                 (attempt_id,))


# --------------------------------------------------------------- transient -> back-off


async def test_slow_down_backs_off_then_the_next_cycle_reconciles(
        db_dsn: str, conn: psycopg.Connection, s3_server: S3Server, bucket: str,
        s3_proxy: FaultProxy) -> None:
    """Object HEAD answers 503 SlowDown: the row stays Pending with attempts+1,
    next_attempt_at = AsOf + min(cap, base·factor^(attempts-1)) ± jitter and last_error
    ``s3:http_503_SlowDown``; once S3 is healthy the next (due) cycle reconciles it."""
    cfg = proxied(db_dsn, s3_server, bucket, s3_proxy)
    rf = cfg.jobs.recording_finalize
    rec = insert_recording(conn, session_id=insert_call_session(conn), attempts=2)
    upload_recording(s3_server, rec.id, bucket=bucket)
    slow_down = HttpRule(heads_of([rec.id]), status=503, headers=SLOW_DOWN)
    s3_proxy.rules.append(slow_down)
    before_cycle = db_now(conn)

    counts = await run_cycle(cfg)

    assert counts_of(counts) == {"transient": 1}
    row = attempt(conn, rec.id)
    assert (row["status"], row["attempts"], row["last_error"]) == (
        "Pending", 3, "s3:http_503_SlowDown")
    delay = min(rf.backoff_cap, rf.backoff_base * rf.backoff_factor ** (row["attempts"] - 1))
    # AsOf was read at the start of the cycle: after before_cycle, before the row's updated_at
    earliest = before_cycle + dt.timedelta(seconds=delay * (1 - rf.backoff_jitter))
    latest = row["updated_at"] + dt.timedelta(seconds=delay * (1 + rf.backoff_jitter))
    assert earliest <= row["next_attempt_at"] <= latest
    assert slow_down.hits == 1
    assert (s3_proxy.seen[0].method, s3_proxy.seen[0].path) == ("HEAD", f"/{bucket}")
    assert recording(conn, rec.id)["status"] == "Uploading"

    s3_proxy.rules.clear()
    make_due(conn, rec.attempt_id)
    counts = await run_cycle(cfg)

    assert counts_of(counts) == {"reconciled": 1}
    row = attempt(conn, rec.id)
    assert (row["status"], row["attempts"], row["last_error"]) == ("Done", 4, None)
    assert recording(conn, rec.id)["status"] == "Available"
    assert len(outbox_rows(conn, rec.id)) == 1


@pytest.mark.parametrize(("fault", "last_error"), [
    pytest.param({"status": 500}, "s3:http_500", id="http_500"),
    pytest.param({"latency": 1.0}, "s3:Timeout", id="slow"),
    pytest.param({"blackhole": True}, "s3:Timeout", id="blackhole"),
    pytest.param({"reset_after": 12}, "s3:ReadError", id="reset_mid_response"),
    pytest.param({"reset_after": 0}, "s3:ReadError", id="reset_before_response"),
])
async def test_transient_faults_keep_the_row_pending_with_their_class(
        db_dsn: str, conn: psycopg.Connection, s3_server: S3Server, bucket: str,
        s3_proxy: FaultProxy, fault: dict[str, Any], last_error: str) -> None:
    """500, a HEAD slower than ``s3.timeout``, no answer, an RST mid-response: each is
    transient, recorded as the class libcurl really reports; the binary is not adopted."""
    cfg = proxied(db_dsn, s3_server, bucket, s3_proxy, s3={"timeout": "400ms"})
    rec = insert_recording(conn, session_id=insert_call_session(conn))
    upload_recording(s3_server, rec.id, bucket=bucket)
    s3_proxy.rules.append(HttpRule(heads_of([rec.id]), **fault))

    counts = await run_cycle(cfg)

    assert counts_of(counts) == {"transient": 1}
    row = attempt(conn, rec.id)
    assert (row["status"], row["attempts"], row["last_error"]) == ("Pending", 1, last_error)
    assert recording(conn, rec.id)["status"] == "Uploading"
    assert outbox_rows(conn) == [] and realtime_rows(conn) == []


# --------------------------------------------------------------------- poison -> quarantine


async def test_transient_failure_of_the_last_attempt_quarantines_until_requeued(
        db_dsn: str, conn: psycopg.Connection, s3_server: S3Server, bucket: str,
        s3_proxy: FaultProxy) -> None:
    """At attempts = max_attempts-1 a transient failure quarantines the row (counted, with
    last_error); later cycles leave it alone even with S3 healthy, until the runbook's
    re-enqueue, after which it is reconciled."""
    cfg = proxied(db_dsn, s3_server, bucket, s3_proxy)
    max_attempts = cfg.jobs.recording_finalize.max_attempts
    rec = insert_recording(conn, session_id=insert_call_session(conn),
                           attempts=max_attempts - 1)
    upload_recording(s3_server, rec.id, bucket=bucket)
    s3_proxy.rules.append(HttpRule(heads_of([rec.id]), status=500))

    counts = await run_cycle(cfg)

    assert counts_of(counts) == {"quarantined": 1}
    row = attempt(conn, rec.id)
    assert (row["status"], row["attempts"], row["last_error"]) == (
        "Quarantined", max_attempts, "s3:http_500")

    s3_proxy.rules.clear()
    make_due(conn, rec.attempt_id)
    counts = await run_cycle(cfg)

    assert counts_of(counts) == {}
    assert attempt(conn, rec.id)["status"] == "Quarantined"
    assert recording(conn, rec.id)["status"] == "Uploading"
    assert not [r for r in s3_proxy.seen if r.path.endswith(rec.id)][1:]

    requeued = conn.execute(FINALIZE_QUERIES["finalize_attempts_requeue"],
                            {"ids": [uuid.UUID(rec.attempt_id)]}).fetchall()
    assert [status for _, status in requeued] == ["Pending"]
    counts = await run_cycle(cfg)

    assert counts_of(counts) == {"reconciled": 1}
    row = attempt(conn, rec.id)
    assert (row["status"], row["attempts"]) == ("Done", 1)
    assert recording(conn, rec.id)["status"] == "Available"


# ----------------------------------------------------------------------- outage breaker


async def test_breaker_stops_claiming_after_k_consecutive_transient_heads(
        db_dsn: str, conn: psycopg.Connection, s3_server: S3Server, bucket: str,
        s3_proxy: FaultProxy) -> None:
    """Every recording's HEAD fails (the bucket HEAD passes): after breaker_threshold (5)
    consecutive transient outcomes the cycle stops sending HEADs and stops claiming. With
    batch_size 5 and 50 due rows only the first claim(s) used an attempt; the rest are
    untouched (attempts, next_attempt_at); the breaker gauge is 1."""
    cfg = proxied(db_dsn, s3_server, bucket, s3_proxy, batch_size=5)
    ids = stuck_recordings(conn, 50)
    before = attempts_by_recording(conn)
    failing = HttpRule(heads_of(ids), status=503, headers=SLOW_DOWN)
    s3_proxy.rules.append(failing)

    counts = await run_cycle(cfg)

    after = attempts_by_recording(conn)
    consumed = [rid for rid in ids if after[rid]["attempts"] == 1]
    untouched = [rid for rid in ids if all(
        after[rid][c] == before[rid][c] for c in ("status", "attempts", "next_attempt_at"))]
    assert len(consumed) + len(untouched) == 50
    # HEADs already handed to the S3 worker when the 5th failed: the reconciler pool
    # (2 x s3.concurrency) — a claim of batch_size rows fills it at once, and the worker
    # starts its queued requests by itself
    pool = pool_size(cfg.s3.concurrency)
    assert 5 <= failing.hits <= 5 + pool, failing.hits
    assert failing.hits <= len(consumed) <= 25, len(consumed)
    assert counts.quarantined == 0
    assert all(after[rid]["status"] == "Pending" for rid in ids)
    assert breaker_gauge() == 1
    assert HEALTH.reason() is None  # an outage is not a configuration fault


async def test_long_outage_with_s3_down_quarantines_nothing_then_recovers(
        db_dsn: str, conn: psycopg.Connection, s3_server: S3Server, bucket: str,
        s3_proxy: FaultProxy) -> None:
    """Many cycles (each after the rows' short back-off has elapsed) while object storage
    refuses connections: no attempt is consumed, nothing is quarantined, and republishing
    (which needs no S3) still happens; after recovery every recording is finalised —
    Available where the binary exists, Failed/Timeout where it does not."""
    cfg = proxied(db_dsn, s3_server, bucket, s3_proxy, batch_size=5, **FAST_BACKOFF)
    ids = stuck_recordings(conn, 15)
    with_binary = ids[:10]
    await put_recordings(s3_server, bucket, with_binary)
    sid = insert_call_session(conn)
    unpublished = [insert_recording(conn, session_id=sid, status="Available").id
                   for _ in range(3)]
    await put_recordings(s3_server, bucket, unpublished)  # Available: the binary is there
    s3_proxy.down = True

    for _ in range(12):
        counts = await run_cycle(cfg)
        assert counts.quarantined == 0
        skip_backoff(db_dsn)

    rows = attempts_by_recording(conn)
    assert all(rows[rid]["attempts"] == 0 for rid in ids)
    assert all(rows[rid]["status"] == "Done" for rid in unpublished)
    assert breaker_gauge() == 1

    s3_proxy.down = False
    await drain(cfg)

    assert_finalised(conn, ids, set(with_binary))
    assert breaker_gauge() == 0


async def test_long_partial_outage_quarantines_nothing(
        db_dsn: str, conn: psycopg.Connection, s3_server: S3Server, bucket: str,
        s3_proxy: FaultProxy) -> None:
    """Object storage answers the bucket HEAD but 503 to every object HEAD (any key) for
    many cycles — a SlowDown storm, volume servers down: no row may be quarantined, and
    after recovery everything is finalised."""
    cfg = proxied(db_dsn, s3_server, bucket, s3_proxy, batch_size=5, **FAST_BACKOFF)
    ids = stuck_recordings(conn, 15)
    with_binary = ids[:10]
    await put_recordings(s3_server, bucket, with_binary)
    s3_proxy.rules.append(HttpRule(s3_object("HEAD"), status=503, headers=SLOW_DOWN))

    for _ in range(12):
        await run_cycle(cfg)
        skip_backoff(db_dsn)

    rows = attempts_by_recording(conn)
    assert [rid for rid in ids if rows[rid]["status"] == "Quarantined"] == []
    s3_proxy.rules.clear()
    await drain(cfg)
    assert_finalised(conn, ids, set(with_binary))


async def drain(cfg: Config, cycles: int = 8) -> None:
    """Run cycles, waiting out the short back-off in between, until one does nothing."""
    for _ in range(cycles):
        counts = counts_of(await run_cycle(cfg))
        if not counts:
            return
        skip_backoff(cfg.postgres.dsn.reveal())
    raise AssertionError(f"still busy after {cycles} cycles: {counts}")


def assert_finalised(conn: psycopg.Connection, ids: list[str], with_binary: set[str]) -> None:
    rows = attempts_by_recording(conn)
    for rid in ids:
        rec = recording(conn, rid)
        assert rows[rid]["status"] == "Done", rows[rid]
        if rid in with_binary:
            assert (rec["status"], rec["file_id"]) == ("Available", f"{PREFIX}{rid}")
            assert len(outbox_rows(conn, rid)) == 1
        else:
            assert (rec["status"], rec["failure_reason"]) == ("Failed", "Timeout")
            assert outbox_rows(conn, rid) == []


# -------------------------------------------------------------------- configuration fault


@pytest.mark.usefixtures("clean_health")
async def test_access_denied_on_object_head_gives_the_batch_back_untouched(
        db_dsn: str, conn: psycopg.Connection, s3_server: S3Server, bucket: str,
        s3_proxy: FaultProxy) -> None:
    """403 on object HEADs (the bucket HEAD passes) is a configuration fault: every claimed
    row is given back exactly as it was (attempts, next_attempt_at), the rest of the
    backlog is not consumed, and readiness names the fault."""
    cfg = proxied(db_dsn, s3_server, bucket, s3_proxy, batch_size=5)
    ids = stuck_recordings(conn, 12, attempts=3)
    before = attempts_by_recording(conn)
    denied = HttpRule(heads_of(ids), status=403)
    s3_proxy.rules.append(denied)

    counts = await run_cycle(cfg)

    after = attempts_by_recording(conn)
    for rid in ids:
        for column in ("status", "attempts", "next_attempt_at", "last_error"):
            assert after[rid][column] == before[rid][column], (rid, column)
        assert recording(conn, rid)["status"] == "Uploading"
    assert 1 <= counts.config_fault <= 12 and denied.hits >= 1
    assert counts_of(counts).keys() <= {"config_fault"}
    reason = HEALTH.reason()
    assert reason is not None and "access_denied_http_403" in reason


# --------------------------------------------------------------------- parallel runners


async def test_two_parallel_runners_finalise_each_recording_exactly_once(
        db_dsn: str, conn: psycopg.Connection, s3_server: S3Server, bucket: str,
        s3_proxy: FaultProxy) -> None:
    """Two cycles at once (failover lag; each with its own pool and S3 client) over 200 due
    rows, 70% with a binary: skip-locked and the status guard make every recording
    transition once, with exactly one outbox row per Available recording and one realtime
    row per recording; every finalize row was claimed by exactly one runner."""
    cfg = proxied(db_dsn, s3_server, bucket, s3_proxy, batch_size=20)
    ids = stuck_recordings(conn, 200)
    with_binary = set(ids[:140])
    await put_recordings(s3_server, bucket, with_binary)
    s3_proxy.rules.append(HttpRule(heads_of(ids), latency=0.02))  # interleave the runners
    results = []

    async def runner() -> None:
        results.append(await run_cycle(cfg))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(runner)
        nursery.start_soon(runner)

    assert all(r.reconciled + r.failed for r in results)  # both runners did work
    assert sum(r.reconciled for r in results) == 140
    assert sum(r.failed for r in results) == 60
    assert sum(r.republished + r.transient + r.quarantined for r in results) == 0
    rows = attempts_by_recording(conn)
    assert {(r["status"], r["attempts"]) for r in rows.values()} == {("Done", 1)}
    assert_finalised(conn, ids, with_binary)
    per_recording = fetch(conn, "SELECT reference_id, count(*) AS n FROM"
                                " messenger.realtime_outbox GROUP BY reference_id")
    assert len(per_recording) == 200 and {r["n"] for r in per_recording} == {1}
    assert len(outbox_rows(conn)) == 140


# ------------------------------------------------------------------------- cancellation


@pytest.mark.parametrize("deadline", [0.01, 0.1, 0.25, 0.45])
async def test_cancelled_cycle_leaves_every_recording_whole_or_untouched(
        db_dsn: str, conn: psycopg.Connection, s3_server: S3Server, bucket: str,
        s3_proxy: FaultProxy, deadline: float) -> None:
    """A cycle cancelled while HEADs are slow: every recording is either fully finalised
    (terminal status, its outbox/realtime rows, finalize row Done) or untouched except the
    claim's attempts/next_attempt_at — never half; a later cycle finishes the rest."""
    cfg = proxied(db_dsn, s3_server, bucket, s3_proxy, batch_size=10, **FAST_BACKOFF)
    ids = stuck_recordings(conn, 40)
    with_binary = set(ids[:28])
    await put_recordings(s3_server, bucket, with_binary)
    before = attempts_by_recording(conn)
    s3_proxy.rules.append(HttpRule(heads_of(ids), latency=0.1))  # >= 0.5 s in all

    with trio.move_on_after(deadline):
        await run_cycle(cfg)

    finished = assert_whole_or_untouched(conn, ids, with_binary, before)
    assert finished < len(ids)  # the cancellation really cut the cycle short
    s3_proxy.rules.clear()
    skip_backoff(db_dsn)
    await drain(cfg)
    assert_finalised(conn, ids, with_binary)


def assert_whole_or_untouched(conn: psycopg.Connection, ids: list[str], with_binary: set[str],
                              before: dict[str, dict[str, Any]]) -> int:
    """Check the per-row invariants; return how many recordings are finalised."""
    rows = attempts_by_recording(conn)
    finished = 0
    for rid in ids:
        rec, row = recording(conn, rid), rows[rid]
        events = [r["kind"] for r in realtime_rows(conn, rid)]
        published = len(outbox_rows(conn, rid))
        if row["status"] == "Done":
            finished += 1
            assert row["attempts"] == before[rid]["attempts"] + 1
            if rid in with_binary:
                assert (rec["status"], published, events) == (
                    "Available", 1, ["RecordingAvailable"]), rid
                assert rec["file_id"] == f"{PREFIX}{rid}" and rec["size_bytes"] is not None
            else:
                assert (rec["status"], rec["failure_reason"], published, events) == (
                    "Failed", "Timeout", 0, ["RecordingFailed"]), rid
            continue
        assert row["status"] == "Pending", row
        assert (rec["status"], rec["file_id"], published, events) == (
            "Uploading", None, 0, []), rid
        assert row["last_error"] is None
        if row["attempts"] == before[rid]["attempts"]:
            assert row["next_attempt_at"] == before[rid]["next_attempt_at"]
        else:
            assert row["attempts"] == before[rid]["attempts"] + 1
            assert row["next_attempt_at"] > before[rid]["next_attempt_at"]
    return finished


# ------------------------------------------------------------------- the S3 worker process


async def test_s3_worker_killed_mid_cycle_keeps_rows_pending_then_next_cycle_reconciles(
        db_dsn: str, conn: psycopg.Connection, s3_server: S3Server, bucket: str,
        s3_proxy: FaultProxy) -> None:
    """SIGKILL of the S3 worker mid-cycle (s3.concurrency 2: two HEADs on the wire, two
    queued in the worker, four rows still in the pool's channel). The four sent rows stay
    Pending with their attempt and ``s3:s3_worker_exited``; the four never sent are given
    back untouched (no worker may start yet: nothing went out); no recording moves and
    the cycle ends normally. The next cycle starts a new worker and reconciles all eight."""
    cfg = proxied(db_dsn, s3_server, bucket, s3_proxy, s3={"concurrency": 2}, **FAST_BACKOFF)
    ids = stuck_recordings(conn, 8)
    await put_recordings(s3_server, bucket, ids)
    on_the_wire = trio.Event()
    is_head = heads_of(ids)

    def held_head(req: HttpRequest) -> bool:
        if not is_head(req):
            return False
        if held.hits + 1 == cfg.s3.concurrency:  # this one fills the last connection
            on_the_wire.set()
        return True

    held = HttpRule(held_head, latency=30)
    s3_proxy.rules.append(held)
    results: list[FinalizeCounts] = []
    starts_before = worker_starts()
    async with open_resources(cfg) as res:
        job = finalize_job(res)
        store = res.store
        assert isinstance(store, WorkerObjectStore)

        async def cycle() -> None:
            results.append(await run_finalize_cycle(job, CycleContext(JOB, "run-1")))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(cycle)
            with trio.fail_after(10):
                await on_the_wire.wait()
            worker = store._worker
            assert worker is not None
            worker.process.kill()

        assert (results[0].transient, results[0].deferred) == (4, 4)
        rows = attempts_by_recording(conn)
        states = sorted((r["status"], r["attempts"], r["last_error"] or "")
                        for r in rows.values())
        assert states == [("Pending", 0, "")] * 4 + [("Pending", 1, "s3:s3_worker_exited")] * 4
        assert {recording(conn, rid)["status"] for rid in ids} == {"Uploading"}
        assert outbox_rows(conn) == [] and realtime_rows(conn) == []

        s3_proxy.rules.clear()
        for row in rows.values():
            make_due(conn, str(row["id"]))
        # the rule under test: WorkerObjectStore starts at most one worker per interval
        await trio.sleep(RESPAWN_INTERVAL)
        counts = await run_finalize_cycle(job, CycleContext(JOB, "run-2"))

    assert counts_of(counts) == {"reconciled": 8}
    assert store.starts == 2 and worker_starts() - starts_before == 2
    assert {recording(conn, rid)["status"] for rid in ids} == {"Available"}
    assert len(outbox_rows(conn)) == 8
