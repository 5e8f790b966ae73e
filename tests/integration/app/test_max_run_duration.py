"""``max_run_duration`` ends a cycle: the claimer (finalize) and the phase loop (reaper) stop
claiming once it is spent, log ``cycle_deadline_reached``, commit what they took and leave
the rest, untouched, to the next cycle.

The cycles run on the real servers with trio's MockClock (rate 0: the cycle's clock stands
still unless the test moves it). Right after the first claim commits, the test moves the
clock past the cycle's ``max_run_duration``: exactly one claim's worth of work is done, so
the counts are exact.
"""

from __future__ import annotations

import io
import json
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import psycopg
import pytest
import trio
import trio.testing

import actors.finalize.claimer
import actors.reaper.cycle
from actors.finalize.cycle import run_finalize_cycle
from actors.finalize.state import FinalizeCounts
from actors.leases.lock_keeper import CycleContext
from actors.reaper.cycle import ReaperCounts, ReaperJob, run_reaper_cycle
from actors.reaper.recorder_signal import open_media_client
from supervision.app.daemon import open_resources
from supervision.app.settings import Config
from supervision.app.tree import finalize_job
from supervision.db.database import open_database
from supervision.dev.s3 import S3Server
from tests.conftest import make_config
from tests.messenger import (
    attempt,
    conference_statuses,
    fetch,
    insert_call_session,
    insert_conference,
    insert_recording,
    recording,
    upload_recording,
)

MAX_RUN = 60.0  # seconds of the mock clock; the test jumps past it after the first claim
REAL_LIMIT = 120.0  # real seconds one cycle may take before the test fails
T = TypeVar("T")


@pytest.fixture
def conn(db_dsn: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(db_dsn, autocommit=True) as c:
        yield c


def events(buffer: io.StringIO, name: str) -> list[dict[str, Any]]:
    lines = (json.loads(line) for line in buffer.getvalue().splitlines() if line.strip())
    return [e for e in lines if e.get("event") == name]


def nonzero(counts: FinalizeCounts | ReaperCounts) -> dict[str, int]:
    data = counts.as_json()
    data.pop("duration_ms")
    return {k: v for k, v in data.items() if v}


def out_of_time_after_first_call(monkeypatch: pytest.MonkeyPatch, module: Any, name: str,
                                 clock: trio.testing.MockClock) -> list[int]:
    """Replace *module.name* (a claim run in the database's worker thread) by one that,
    after its first call returns, moves the cycle's clock past ``max_run_duration``.
    Returns the list of calls made (one item per call)."""
    original: Callable[..., Any] = getattr(module, name)
    calls: list[int] = []

    def claim(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        calls.append(1)
        if len(calls) == 1:
            trio.from_thread.run_sync(clock.jump, MAX_RUN + 1)
        return result

    monkeypatch.setattr(module, name, claim)
    return calls


async def within_real_seconds(seconds: float, cycle: Callable[[], Awaitable[T]]) -> T:
    """*cycle()*, failed after *seconds* of real time: on a clock that stands still a
    timer the cycle waited on would otherwise hang the test."""
    result: list[T] = []
    with trio.CancelScope() as limit:
        async with trio.open_nursery() as nursery:

            async def run() -> None:
                result.append(await cycle())
                nursery.cancel_scope.cancel()

            nursery.start_soon(run)
            await trio.to_thread.run_sync(time.sleep, seconds, abandon_on_cancel=True)
            limit.cancel()
    assert result, f"the cycle did not end within {seconds} s of real time"
    return result[0]


async def finalize_cycle(cfg: Config) -> FinalizeCounts:
    async def cycle() -> FinalizeCounts:
        async with open_resources(cfg) as res:
            return await run_finalize_cycle(
                finalize_job(res), CycleContext("recording-finalize", str(uuid.uuid4())))

    return await within_real_seconds(REAL_LIMIT, cycle)


async def test_max_run_duration_stops_the_finalize_claimer_and_leaves_the_rest(
        db_dsn: str, conn: psycopg.Connection, s3_server: S3Server, bucket: str,
        mock_clock: trio.testing.MockClock, no_secrets_in_logs: io.StringIO,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """12 due rows, batch_size 5, the cycle's time spent after the first claim: the claimer
    logs cycle_deadline_reached and claims no more; the 5 oldest rows are committed
    (Available), the other 7 are left Pending with attempts 0 and their due time; the next
    cycle takes those 7."""
    cfg = make_config(db_dsn, s3_server=s3_server, bucket=bucket, jobs={"recording_finalize": {
        "batch_size": 5, "max_run_duration": f"{int(MAX_RUN)}s", "lock_ttl": "5m"}})
    recs = []
    for n in range(12):  # oldest first: the claim takes rows in next_attempt_at order
        rec = insert_recording(conn, session_id=insert_call_session(conn),
                               due_ago=1000.0 - n * 10)
        upload_recording(s3_server, rec.id, bucket=bucket)
        recs.append(rec)
    before = {rec.id: attempt(conn, rec.id) for rec in recs}
    calls = out_of_time_after_first_call(monkeypatch, actors.finalize.claimer, "claim_due",
                                         mock_clock)

    first = await finalize_cycle(cfg)

    assert len(calls) == 1, "no claim after the deadline"
    assert nonzero(first) == {"reconciled": 5}
    assert len(events(no_secrets_in_logs, "cycle_deadline_reached")) == 1
    assert [recording(conn, r.id)["status"] for r in recs] == ["Available"] * 5 + [
        "Uploading"] * 7
    assert [attempt(conn, r.id)["status"] for r in recs[:5]] == ["Done"] * 5
    assert [attempt(conn, r.id) for r in recs[5:]] == [before[r.id] for r in recs[5:]]

    monkeypatch.undo()
    second = await finalize_cycle(cfg)
    assert nonzero(second) == {"reconciled": 7}
    assert len(events(no_secrets_in_logs, "cycle_deadline_reached")) == 1  # none in this one
    assert {recording(conn, r.id)["status"] for r in recs} == {"Available"}


async def test_max_run_duration_stops_the_reaper_between_phases(
        db_dsn: str, conn: psycopg.Connection, mock_clock: trio.testing.MockClock,
        no_secrets_in_logs: io.StringIO, monkeypatch: pytest.MonkeyPatch) -> None:
    """Empty rooms, stuck provisioning and stale live rooms all due, the cycle's time spent
    after the first phase's batch: the reaper logs cycle_deadline_reached naming the next
    phase, ends only the empty rooms, and leaves the others Active/Provisioning for the
    next cycle, which ends them."""
    cfg = make_config(db_dsn, jobs={"conference_reaper": {
        "batch_size": 10, "max_run_duration": f"{int(MAX_RUN)}s", "lock_ttl": "5m"}})
    empty = [insert_conference(conn, last_activity_ago=600, participants=2) for _ in range(3)]
    provisioning = [insert_conference(conn, status="Provisioning", created_ago=3600)
                    for _ in range(2)]
    stale = [insert_conference(conn, last_activity_ago=6 * 3600, active_participants=2)
             for _ in range(2)]
    calls = out_of_time_after_first_call(monkeypatch, actors.reaper.cycle, "reap_phase",
                                         mock_clock)

    async def reaper_cycle() -> ReaperCounts:
        async with open_database(cfg.postgres.dsn.reveal(), size=2) as db, \
                open_media_client(cfg.media) as http:
            job = ReaperJob(cfg.jobs.conference_reaper, cfg.media, db, http)
            return await run_reaper_cycle(job, CycleContext("conference-reaper",
                                                            str(uuid.uuid4())))

    async def cycle() -> ReaperCounts:
        return await within_real_seconds(REAL_LIMIT, reaper_cycle)

    first = await cycle()

    assert len(calls) == 1
    assert nonzero(first) == {"empty_timeout": 3}
    (reached,) = events(no_secrets_in_logs, "cycle_deadline_reached")
    assert reached["phase"] == "provision-timeout"
    statuses = conference_statuses(conn)
    assert {statuses[c.id] for c in empty} == {("Ended", "EmptyTimeout")}
    assert {statuses[c.id] for c in provisioning} == {("Provisioning", None)}
    assert {statuses[c.id] for c in stale} == {("Active", None)}
    assert fetch(conn, "SELECT count(*) AS n FROM messenger.integration_outbox") == [{"n": 3}]

    monkeypatch.undo()
    second = await cycle()
    assert nonzero(second) == {"provision_failed": 2, "stale_timeout": 2}
    statuses = conference_statuses(conn)
    assert {statuses[c.id][0] for c in provisioning + stale} == {"Failed", "Ended"}
