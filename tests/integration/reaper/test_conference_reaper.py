"""conference-reaper on real PostgreSQL and a real HTTP stand-in for the media stack: the
seed's test table, SPEC §2/§4/§5 and the job's observability."""

from __future__ import annotations

import datetime as dt
import json
import math
import uuid
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import psycopg
import pytest
import structlog
import trio
from prometheus_client import REGISTRY

from actors.envelope import TOPIC_CONFERENCE_ENDED, event_id
from actors.leases.lease import LockConnection
from actors.leases.lock_keeper import CycleContext, LockedJob, run_locked_cycle, serve_lock_keeper
from actors.reaper.cycle import ReaperCounts, ReaperJob, run_reaper_cycle
from actors.reaper.queries import REAPER_QUERIES
from actors.reaper.recorder_signal import open_media_client
from supervision.app.queries import ALL_QUERIES
from supervision.app.runbook import Released, requeue
from supervision.app.runbook import status as read_status
from supervision.app.settings import Config
from supervision.db.database import Database, open_database
from supervision.errors import InfrastructureError
from supervision.tree.shielding import StopGuard, WorkAbandoned, guarded_by
from tests.conftest import make_config
from tests.media_stub import MediaStub, media_stub  # noqa: F401  (fixture)
from tests.messenger import (
    Participant,
    conference,
    conference_statuses,
    db_now,
    fetch,
    insert_conference,
    insert_conference_recording,
    outbox_rows,
    realtime_rows,
)

JOB = "conference-reaper"
SPEC_KEYS = {"empty_timeout", "provision_failed", "stale_timeout", "skipped_locked", "errors",
             "duration_ms"}
PAYLOAD_KEYS = {"ConferenceId", "ChatId", "DealId", "TenantId", "MediaType", "Status",
                "EndReason", "StartedByUserId", "StartedAt", "EndedAt", "DurationSeconds",
                "PeakParticipantCount", "Participants", "WasRecorded", "RecordingId"}


class Wakeups:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> None:
        self.calls += 1


def reaper_job(cfg: Config, db: Any, http: Any, wake: Callable[[], None] | None = None
               ) -> ReaperJob:
    kwargs = {} if wake is None else {"wake_relay": wake}
    return ReaperJob(cfg.jobs.conference_reaper, cfg.media, db, http, **kwargs)


async def run_cycle(cfg: Config, wake: Callable[[], None] | None = None,
                    run_id: str | None = None) -> ReaperCounts:
    async with open_database(cfg.postgres.dsn.reveal(), size=2) as db, \
            open_media_client(cfg.media) as http:
        ctx = CycleContext(JOB, run_id or str(uuid.uuid4()))
        return await run_reaper_cycle(reaper_job(cfg, db, http, wake), ctx)


def counts_of(c: ReaperCounts) -> dict[str, int]:
    data = c.as_json()
    data.pop("duration_ms")
    return {k: v for k, v in data.items() if v}


def metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def iso(value: dt.datetime | None) -> str | None:
    if value is None:
        return None
    return value.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@pytest.fixture
def conn(db_dsn: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(db_dsn, autocommit=True) as c:
        yield c


@pytest.fixture
def cfg(db_dsn: str, media_stub: MediaStub) -> Config:  # noqa: F811
    return make_config(db_dsn, media={"base_url": media_stub.base_url, "timeout": "1s"})


# ------------------------------------------------------------------------ the seed's table


async def test_empty_batch_is_a_no_op(cfg: Config, conn: psycopg.Connection,
                                      media_stub: MediaStub) -> None:  # noqa: F811
    """Nothing past its window: success, every SPEC §7 key zero, no mutation, no event."""
    insert_conference(conn, last_activity_ago=30)  # empty, inside the 90 s grace
    insert_conference(conn, last_activity_ago=600, active_participants=2)
    insert_conference(conn, status="Provisioning", created_ago=60)
    done = insert_conference(conn, status="Ended", last_activity_ago=9 * 3600)
    before = fetch(conn, "SELECT * FROM messenger.conference_sessions ORDER BY id")
    wake = Wakeups()
    counts = await run_cycle(cfg, wake)
    assert set(counts.as_json()) == SPEC_KEYS
    assert counts_of(counts) == {}
    assert fetch(conn, "SELECT * FROM messenger.conference_sessions ORDER BY id") == before
    assert conference(conn, done.id)["end_reason"] is None
    assert outbox_rows(conn) == [] and realtime_rows(conn) == []
    assert media_stub.requests == [] and wake.calls == 0


async def test_empty_room_is_ended_with_event_and_realtime_row(
        cfg: Config, conn: psycopg.Connection) -> None:
    """Active, nobody in, idle past the grace: Ended/EmptyTimeout at AsOf with the duration
    since started_at, one conference-ended outbox row (key DealId, SPEC §4 headers) and a
    realtime ConferenceEnded row for the chat; the relay is woken once."""
    conf = insert_conference(conn, last_activity_ago=120, started_ago=1000, participants=2)
    wake, run_id = Wakeups(), str(uuid.uuid4())
    before = db_now(conn)
    counts = await run_cycle(cfg, wake, run_id)
    after = db_now(conn)
    assert counts_of(counts) == {"empty_timeout": 1}
    row = conference(conn, conf.id)
    assert (row["status"], row["end_reason"]) == ("Ended", "EmptyTimeout")
    assert before <= row["ended_at"] <= after
    assert row["duration_seconds"] == math.floor(
        (row["ended_at"] - row["started_at"]).total_seconds())
    assert 1000 <= row["duration_seconds"] <= 1002
    (event,) = outbox_rows(conn)
    assert (event["topic"], event["message_key"], event["dedupe_key"], event["event_type"]) == (
        TOPIC_CONFERENCE_ENDED, conf.deal_id, conf.id, "ConferenceEnded")
    assert event["headers"] == {
        "event-type": "ConferenceEnded", "event-id": event_id(TOPIC_CONFERENCE_ENDED, conf.id),
        "correlation-id": run_id, "source": "safetynet.conference-reaper",
        "content-type": "application/json"}
    (rt,) = realtime_rows(conn)
    assert (rt["kind"], rt["target_kind"], str(rt["chat_id"]), rt["session_kind"],
            str(rt["reference_id"])) == (
        "ConferenceEnded", "ChatGroup", conf.chat_id, "Conference", conf.id)
    assert rt["payload"] == {"ConferenceId": conf.id, "Status": "Ended",
                             "EndReason": "EmptyTimeout"}
    assert wake.calls == 1


async def test_room_someone_joined_within_grace_is_untouched(
        cfg: Config, conn: psycopg.Connection) -> None:
    """A participant in the room (count > 0), or an empty room still inside its grace, is
    out of the empty-room selection; a due room next to them is reaped."""
    joined = insert_conference(conn, last_activity_ago=300, active_participants=1)
    fresh = insert_conference(conn, last_activity_ago=60)
    due = insert_conference(conn, last_activity_ago=300)
    counts = await run_cycle(cfg)
    assert counts_of(counts) == {"empty_timeout": 1}
    statuses = conference_statuses(conn)
    assert statuses[joined.id] == ("Active", None) and statuses[fresh.id] == ("Active", None)
    assert statuses[due.id] == ("Ended", "EmptyTimeout")
    assert [r["dedupe_key"] for r in outbox_rows(conn)] == [due.id]


async def test_provision_timeout_fails_without_conference_ended(
        cfg: Config, conn: psycopg.Connection) -> None:
    """Provisioning past provision_timeout: Failed/Error, ended_at, no started_at or
    duration, no conference-ended; a realtime ConferenceSignal(Failed) for the chat; the
    provision_failed outcome is counted and the relay is not woken."""
    conf = insert_conference(conn, status="Provisioning", created_ago=180, participants=1)
    young = insert_conference(conn, status="Provisioning", created_ago=60)
    before = metric("messenger_conf_reaper_items_total", outcome="provision_failed")
    wake = Wakeups()
    counts = await run_cycle(cfg, wake)
    assert counts_of(counts) == {"provision_failed": 1}
    row = conference(conn, conf.id)
    assert (row["status"], row["end_reason"]) == ("Failed", "Error")
    assert row["ended_at"] is not None
    assert row["started_at"] is None and row["duration_seconds"] is None
    assert conference_statuses(conn)[young.id] == ("Provisioning", None)
    assert outbox_rows(conn) == []
    (rt,) = realtime_rows(conn)
    assert (rt["kind"], rt["target_kind"], str(rt["chat_id"]), rt["session_kind"]) == (
        "ConferenceSignal", "ChatGroup", conf.chat_id, "Conference")
    assert rt["payload"] == {"ConferenceId": conf.id, "Status": "Failed", "EndReason": "Error"}
    assert metric("messenger_conf_reaper_items_total", outcome="provision_failed") == before + 1
    assert wake.calls == 0


async def test_stale_live_room_is_ended_with_timeout_and_event(
        cfg: Config, conn: psycopg.Connection) -> None:
    """Active with people in it but no presence activity for stale_live_timeout:
    Ended/Timeout with its conference-ended event."""
    conf = insert_conference(conn, last_activity_ago=4 * 3600 + 60, active_participants=3,
                             participants=3)
    live = insert_conference(conn, last_activity_ago=3 * 3600, active_participants=3)
    counts = await run_cycle(cfg)
    assert counts_of(counts) == {"stale_timeout": 1}
    assert conference_statuses(conn)[conf.id] == ("Ended", "Timeout")
    assert conference_statuses(conn)[live.id] == ("Active", None)
    (event,) = outbox_rows(conn)
    assert (event["dedupe_key"], event["payload"]["EndReason"]) == (conf.id, "Timeout")
    assert [r["kind"] for r in realtime_rows(conn, conf.id)] == ["ConferenceEnded"]


async def test_room_due_in_two_phases_is_ended_once_by_the_first(
        cfg: Config, conn: psycopg.Connection) -> None:
    """Empty and idle past the stale timeout too: empty-room runs first and ends it; the
    stale-live phase no longer selects it (one transition, one event)."""
    conf = insert_conference(conn, last_activity_ago=5 * 3600)
    counts = await run_cycle(cfg)
    assert counts_of(counts) == {"empty_timeout": 1}
    assert conference_statuses(conn)[conf.id] == ("Ended", "EmptyTimeout")
    assert len(outbox_rows(conn)) == 1 and len(realtime_rows(conn)) == 1


async def test_running_recording_gets_a_stop_signal(
        db_dsn: str, conn: psycopg.Connection, media_stub: MediaStub) -> None:  # noqa: F811
    """After the commit, every running recording of a closed conference (Ended or Failed)
    gets one POST /recordings/{id}/stop with its Idempotency-Key, the bearer token and the
    SPEC §5 body; finished recordings get none."""
    cfg = make_config(db_dsn, media={"base_url": media_stub.base_url, "token": "s3cret-tok"})
    conf = insert_conference(conn, last_activity_ago=120)
    running = insert_conference_recording(conn, conf, status="Recording")
    finished = insert_conference_recording(conn, conf, status="Available", created_ago=900)
    failed_room = insert_conference(conn, status="Provisioning", created_ago=300)
    pending = insert_conference_recording(conn, failed_room, status="Pending")
    with structlog.testing.capture_logs() as logs:
        counts = await run_cycle(cfg)
    assert counts_of(counts) == {"empty_timeout": 1, "provision_failed": 1}
    (stop,) = media_stub.stops_for(running)
    assert (stop.method, stop.path) == ("POST", f"/recordings/{running}/stop")
    assert stop.headers["idempotency-key"] == running
    assert stop.headers["authorization"] == "Bearer s3cret-tok"
    assert stop.headers["content-type"] == "application/json"
    assert stop.body == {"SessionId": conf.id, "Reason": "ConferenceEnded"}
    (other,) = media_stub.stops_for(pending)
    assert other.body == {"SessionId": failed_room.id, "Reason": "ConferenceEnded"}
    assert media_stub.stops_for(finished) == [] and len(media_stub.requests) == 2
    assert "s3cret-tok" not in json.dumps(logs, default=str)


async def test_stop_signal_has_no_authorization_without_token(
        cfg: Config, conn: psycopg.Connection, media_stub: MediaStub) -> None:  # noqa: F811
    """No media.token configured: the stop request carries no Authorization header."""
    conf = insert_conference(conn, last_activity_ago=120)
    rid = insert_conference_recording(conn, conf, status="Uploading")
    await run_cycle(cfg)
    (stop,) = media_stub.stops_for(rid)
    assert "authorization" not in stop.headers


@pytest.mark.parametrize(("trouble", "reason"), [("500", "http_status"), ("hang", "timeout")])
async def test_failing_recorder_never_rolls_back_the_batch(
        db_dsn: str, conn: psycopg.Connection, media_stub: MediaStub,  # noqa: F811
        trouble: str, reason: str) -> None:
    """The media stack answers 500 or never answers: the conference stays Ended with its
    event, the failure is logged (recording id and status, no URL) and counted, the other
    stop still goes out. (That the stops are bounded by 1.5 x media.timeout is checked on
    a fake clock, tests/unit/reaper/test_recorder_signal_fan_out.py: no wall clock here.)"""
    cfg = make_config(db_dsn, media={"base_url": media_stub.base_url, "timeout": "0.5s"})
    conf = insert_conference(conn, last_activity_ago=120)
    bad = insert_conference_recording(conn, conf, status="Recording")
    good = insert_conference_recording(conn, conf, status="Recording", created_ago=100)
    if trouble == "hang":
        media_stub.hang(bad)
    else:
        media_stub.answer(bad, 500)
    before = metric("safetynet_recorder_stop_failed_total", reason=reason)
    with structlog.testing.capture_logs() as logs:
        counts = await run_cycle(cfg)
    assert counts_of(counts) == {"empty_timeout": 1}
    assert conference_statuses(conn)[conf.id] == ("Ended", "EmptyTimeout")
    assert len(outbox_rows(conn, conf.id)) == 1
    assert len(media_stub.stops_for(bad)) == 1 and len(media_stub.stops_for(good)) == 1
    assert metric("safetynet_recorder_stop_failed_total", reason=reason) == before + 1
    (failure,) = [e for e in logs if e["event"] == "recorder_stop_failed"]
    assert failure["recording_id"] == bad
    assert failure["error"] == ("500" if trouble == "500" else "timeout")
    assert "127.0.0.1" not in json.dumps(logs, default=str)


async def test_stop_fan_out_is_bounded_by_one_and_a_half_timeouts(
        db_dsn: str, conn: psycopg.Connection, media_stub: MediaStub) -> None:  # noqa: F811
    """A media stack that hangs on every stop cannot stretch the cycle past 1.5 x
    media.timeout of fan-out: the stop in flight times out, those still queued are
    abandoned (the last one never sent), all logged and counted, and the room stays Ended
    with its event. The bound itself, to the tick, is checked on a fake clock
    (tests/unit/reaper/test_recorder_signal_fan_out.py): timing this whole cycle on a loaded
    machine measured its claims and commits too (0.85 s once, against 0.75 s)."""
    cfg = make_config(db_dsn, media={"base_url": media_stub.base_url, "timeout": "0.3s"})
    conf = insert_conference(conn, last_activity_ago=120)
    hung = [insert_conference_recording(conn, conf, created_ago=300 - n) for n in range(3)]
    for rid in hung:
        media_stub.hang(rid)
    before = {r: metric("safetynet_recorder_stop_failed_total", reason=r)
              for r in ("timeout", "abandoned")}
    async with open_database(db_dsn, size=2) as db, open_media_client(cfg.media) as http:
        job = ReaperJob(cfg.jobs.conference_reaper, cfg.media, db, http, stop_concurrency=1)
        with structlog.testing.capture_logs() as logs:
            counts = await run_reaper_cycle(job, CycleContext(JOB, str(uuid.uuid4())))
    assert counts_of(counts) == {"empty_timeout": 1}
    assert len(outbox_rows(conn, conf.id)) == 1
    failed = {e["recording_id"]: e["error"] for e in logs
              if e["event"] == "recorder_stop_failed"}
    assert set(failed) == set(hung)
    assert sorted(failed.values()) == ["abandoned", "abandoned", "timeout"]
    # one at a time: waiting for all three would have sent all three
    assert len(media_stub.requests) < len(hung)
    after = {r: metric("safetynet_recorder_stop_failed_total", reason=r) for r in before}
    assert (after["timeout"] - before["timeout"], after["abandoned"] - before["abandoned"]
            ) == (1, 2)


async def test_recorder_answering_404_or_409_counts_as_done(
        cfg: Config, conn: psycopg.Connection, media_stub: MediaStub) -> None:  # noqa: F811
    """SPEC §5: 404 (recorder already gone) and 409 (already stopping) are done, not
    failures: nothing is logged as failed or counted."""
    conf = insert_conference(conn, last_activity_ago=120)
    gone = insert_conference_recording(conn, conf, status="Recording")
    stopping = insert_conference_recording(conn, conf, status="Uploading", created_ago=100)
    media_stub.answer(gone, 404)
    media_stub.answer(stopping, 409)
    before = {r: metric("safetynet_recorder_stop_failed_total", reason=r)
              for r in ("http_status", "timeout", "connection", "error", "abandoned")}
    with structlog.testing.capture_logs() as logs:
        await run_cycle(cfg)
    assert len(media_stub.stops_for(gone)) == 1 and len(media_stub.stops_for(stopping)) == 1
    sent = sorted(e["status"] for e in logs if e["event"] == "recorder_stop_sent")
    assert sent == ["404", "409"]
    assert not [e for e in logs if e["event"] == "recorder_stop_failed"]
    assert {r: metric("safetynet_recorder_stop_failed_total", reason=r) for r in before} == before


async def test_second_cycle_is_a_no_op_without_second_event(
        cfg: Config, conn: psycopg.Connection) -> None:
    """A repeated cycle over Ended/Failed conferences changes nothing and emits nothing."""
    empty = insert_conference(conn, last_activity_ago=120)
    insert_conference(conn, status="Provisioning", created_ago=300)
    insert_conference(conn, last_activity_ago=5 * 3600, active_participants=1)
    first = await run_cycle(cfg)
    snapshot = fetch(conn, "SELECT * FROM messenger.conference_sessions ORDER BY id")
    wake = Wakeups()
    second = await run_cycle(cfg, wake)
    assert counts_of(first) == {"empty_timeout": 1, "provision_failed": 1, "stale_timeout": 1}
    assert counts_of(second) == {}
    assert fetch(conn, "SELECT * FROM messenger.conference_sessions ORDER BY id") == snapshot
    assert len(outbox_rows(conn)) == 2 and len(realtime_rows(conn)) == 3
    assert len(outbox_rows(conn, empty.id)) == 1 and wake.calls == 0


async def test_event_written_before_is_not_duplicated(
        cfg: Config, conn: psycopg.Connection) -> None:
    """An outbox row for the conference already exists (a re-emit): the room is ended, the
    existing row is kept (ON CONFLICT DO NOTHING by ConferenceId) and the relay not woken."""
    conf = insert_conference(conn, last_activity_ago=120)
    conn.execute("INSERT INTO messenger.integration_outbox (topic, message_key, dedupe_key,"
                 " event_type, payload) VALUES (%s, %s, %s, 'ConferenceEnded', '{}')",
                 (TOPIC_CONFERENCE_ENDED, conf.deal_id, conf.id))
    wake = Wakeups()
    counts = await run_cycle(cfg, wake)
    assert counts_of(counts) == {"empty_timeout": 1}
    (event,) = outbox_rows(conn, conf.id)
    assert event["payload"] == {}
    assert wake.calls == 0


async def test_row_locked_by_end_conference_is_skipped_and_counted(
        cfg: Config, conn: psycopg.Connection, db_dsn: str) -> None:
    """A due room held by an in-flight command (SELECT ... FOR UPDATE on another
    connection) is skipped without waiting and counted in skipped_locked; once released,
    the next cycle reaps it."""
    held = insert_conference(conn, last_activity_ago=120)
    free = insert_conference(conn, last_activity_ago=120)
    before = metric("messenger_conf_reaper_skip_locked_total")
    with psycopg.connect(db_dsn) as command:
        command.execute("SELECT 1 FROM messenger.conference_sessions WHERE id = %s"
                        " FOR UPDATE", (held.id,))
        with trio.fail_after(10):
            counts = await run_cycle(cfg)
        assert counts_of(counts) == {"empty_timeout": 1, "skipped_locked": 1}
        assert conference_statuses(conn)[held.id] == ("Active", None)
        assert conference_statuses(conn)[free.id] == ("Ended", "EmptyTimeout")
        command.rollback()
    assert metric("messenger_conf_reaper_skip_locked_total") == before + 1
    again = await run_cycle(cfg)
    assert counts_of(again) == {"empty_timeout": 1}
    assert conference_statuses(conn)[held.id] == ("Ended", "EmptyTimeout")


async def test_conference_ended_before_the_tick_is_out_of_selection(
        cfg: Config, conn: psycopg.Connection) -> None:
    """end-conference committed Ended/Normal before the tick: untouched, no event."""
    conf = insert_conference(conn, last_activity_ago=600)
    conn.execute("UPDATE messenger.conference_sessions SET status = 'Ended',"
                 " end_reason = 'Normal', ended_at = now(), duration_seconds = 1,"
                 " updated_at = now() WHERE id = %s", (conf.id,))
    before = conference(conn, conf.id)
    counts = await run_cycle(cfg)
    assert counts_of(counts) == {}
    assert conference(conn, conf.id) == before
    assert outbox_rows(conn) == [] and realtime_rows(conn) == []


async def test_parallel_instances_reap_each_conference_exactly_once(
        db_dsn: str, conn: psycopg.Connection, media_stub: MediaStub) -> None:  # noqa: F811
    """Two runners that bypass the single-runner lock, each with its own pool, cycling
    concurrently over 90 due rooms: every room is made terminal once (one realtime row
    each, one outbox row per ended room, counts summing to the total)."""
    cfg = make_config(db_dsn, media={"base_url": media_stub.base_url},
                      jobs={"conference_reaper": {"batch_size": 10}})
    rooms = ([insert_conference(conn, last_activity_ago=120 + n, participants=2)
              for n in range(30)]
             + [insert_conference(conn, status="Provisioning", created_ago=300 + n)
                for n in range(30)]
             + [insert_conference(conn, last_activity_ago=5 * 3600 + n, active_participants=1)
                for n in range(30)])
    totals: list[ReaperCounts] = []

    async def instance(name: str) -> None:
        async with open_database(db_dsn, size=2, name=name) as db, \
                open_media_client(cfg.media) as http:
            job = reaper_job(cfg, db, http)
            while True:
                counts = await run_reaper_cycle(job, CycleContext(JOB, str(uuid.uuid4())))
                totals.append(counts)
                if not (counts.empty_timeout or counts.provision_failed
                        or counts.stale_timeout or counts.skipped_locked):
                    return

    async with trio.open_nursery() as nursery:
        nursery.start_soon(instance, "reaper-a")
        nursery.start_soon(instance, "reaper-b")
    statuses = conference_statuses(conn)
    assert all(statuses[r.id][0] in ("Ended", "Failed") for r in rooms)
    rt = realtime_rows(conn)
    assert sorted(str(r["reference_id"]) for r in rt) == sorted(r.id for r in rooms)
    events = outbox_rows(conn)
    assert len(events) == 60 and len({e["dedupe_key"] for e in events}) == 60
    assert sum(c.empty_timeout for c in totals) == 30
    assert sum(c.provision_failed for c in totals) == 30
    assert sum(c.stale_timeout for c in totals) == 30


async def test_single_runner_lock_lets_only_one_instance_run(
        cfg: Config, conn: psycopg.Connection) -> None:
    """While one runner holds the job's advisory lock, a second tick elsewhere is skipped
    and reaps nothing."""
    conf = insert_conference(conn, last_activity_ago=120)
    holding, release = trio.Event(), trio.Event()
    dsn = cfg.postgres.dsn.reveal()
    outcomes: dict[str, Any] = {}

    async with open_database(dsn, size=2) as db, open_media_client(cfg.media) as http:
        job = reaper_job(cfg, db, http)

        async def held_cycle(ctx: CycleContext) -> ReaperCounts:
            counts = await run_reaper_cycle(job, ctx)
            holding.set()
            await release.wait()
            return counts

        async def first() -> None:
            lock = LockConnection(dsn)
            try:
                outcomes["first"] = await run_locked_cycle(
                    LockedJob(JOB, 30, 10, held_cycle), lock)
            finally:
                lock.discard()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(first)
            await holding.wait()
            lock = LockConnection(dsn)
            try:
                outcomes["second"] = await run_locked_cycle(
                    LockedJob(JOB, 30, 10, partial(run_reaper_cycle, job)), lock)
            finally:
                lock.discard()
            release.set()
    assert outcomes["second"].status == "skipped_locked"
    assert outcomes["first"].status == "ran"
    assert counts_of(outcomes["first"].result) == {"empty_timeout": 1}
    assert conference_statuses(conn)[conf.id] == ("Ended", "EmptyTimeout")


def seed_three_phases(conn: psycopg.Connection, per_phase: int) -> None:
    for n in range(per_phase):
        room = insert_conference(conn, last_activity_ago=120 + n, participants=3)
        insert_conference_recording(conn, room)
        insert_conference(conn, status="Provisioning", created_ago=300 + n)
        insert_conference(conn, last_activity_ago=5 * 3600 + n, active_participants=2,
                          participants=2)


def assert_each_phase_all_or_nothing(conn: psycopg.Connection, per_phase: int) -> None:
    ended = fetch(conn, "SELECT end_reason, count(*) AS n FROM messenger.conference_sessions"
                        " WHERE status IN ('Ended', 'Failed') GROUP BY end_reason")
    by_reason = {r["end_reason"]: r["n"] for r in ended}
    events = fetch(conn, "SELECT payload->>'EndReason' AS reason, count(*) AS n"
                         " FROM messenger.integration_outbox GROUP BY 1")
    by_event = {r["reason"]: r["n"] for r in events}
    rt = fetch(conn, "SELECT payload->>'EndReason' AS reason, count(*) AS n"
                     " FROM messenger.realtime_outbox GROUP BY 1")
    by_rt = {r["reason"]: r["n"] for r in rt}
    for reason in ("EmptyTimeout", "Timeout"):
        assert by_reason.get(reason, 0) in (0, per_phase)
        assert by_event.get(reason, 0) == by_reason.get(reason, 0) == by_rt.get(reason, 0)
    assert by_reason.get("Error", 0) in (0, per_phase)
    assert by_rt.get("Error", 0) == by_reason.get("Error", 0)
    assert "Error" not in by_event


def assert_no_row_locks_left(conn: psycopg.Connection) -> None:
    with conn.transaction():
        conn.execute("SELECT 1 FROM messenger.conference_sessions FOR UPDATE NOWAIT")


class CancelOnNthTransaction:
    """A Database that cancels *scope* just as its *nth* transaction (a phase's batch)
    starts: the cancellation arrives while that batch is in flight."""

    def __init__(self, db: Database, scope: trio.CancelScope, nth: int) -> None:
        self.db, self.scope, self.nth, self.calls = db, scope, nth, 0

    async def atomic(self, fn: Any, *args: Any) -> Any:
        self.calls += 1
        if self.calls == self.nth:
            self.scope.cancel()
        return await self.db.atomic(fn, *args)

    async def run(self, fn: Any, *args: Any) -> Any:
        return await self.db.run(fn, *args)


@pytest.mark.parametrize(("nth", "committed"), [
    (1, {"EmptyTimeout"}), (2, {"EmptyTimeout", "Error"}),
    (3, {"EmptyTimeout", "Error", "Timeout"})])
async def test_cancel_while_a_batch_is_in_flight_commits_that_batch_whole(
        cfg: Config, conn: psycopg.Connection, nth: int, committed: set[str]) -> None:
    """Cancelled as the nth phase's transaction starts: that batch and the ones before it
    commit whole (transitions, outbox and realtime rows), later phases never start, no row
    lock is left behind, and the run is counted as cancelled, not as an error."""
    per_phase = 12
    seed_three_phases(conn, per_phase)
    cancelled = metric("messenger_conf_reaper_run_total", status="cancelled")
    async with open_database(cfg.postgres.dsn.reveal(), size=2) as db, \
            open_media_client(cfg.media) as http:
        with trio.CancelScope() as scope:
            job = reaper_job(cfg, CancelOnNthTransaction(db, scope, nth), http)
            await run_reaper_cycle(job, CycleContext(JOB, str(uuid.uuid4())))
    assert scope.cancelled_caught
    assert metric("messenger_conf_reaper_run_total", status="cancelled") == cancelled + 1
    assert_each_phase_all_or_nothing(conn, per_phase)
    reasons = {r for _, r in conference_statuses(conn).values() if r is not None}
    assert reasons == committed
    assert_no_row_locks_left(conn)


@pytest.mark.parametrize("deadline", [0.0, 0.002, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05])
async def test_cycle_cancelled_at_any_time_leaves_each_batch_all_or_nothing(
        cfg: Config, conn: psycopg.Connection, deadline: float) -> None:
    """Cancelled after *deadline*, wherever that falls, each phase's batch is committed
    whole or not at all, no row lock is left behind, and the next cycle finishes the rest
    with exactly one event per ended room."""
    per_phase = 12
    seed_three_phases(conn, per_phase)
    async with open_database(cfg.postgres.dsn.reveal(), size=2) as db, \
            open_media_client(cfg.media) as http:
        job = reaper_job(cfg, db, http)
        with trio.move_on_after(deadline):
            await run_reaper_cycle(job, CycleContext(JOB, str(uuid.uuid4())))
        assert_each_phase_all_or_nothing(conn, per_phase)
        assert_no_row_locks_left(conn)
        await run_reaper_cycle(job, CycleContext(JOB, str(uuid.uuid4())))
    assert_each_phase_all_or_nothing(conn, per_phase)
    assert all(s[0] in ("Ended", "Failed") for s in conference_statuses(conn).values())
    assert len(outbox_rows(conn)) == 2 * per_phase


async def test_hard_stop_rolls_the_batch_in_flight_back(
        cfg: Config, conn: psycopg.Connection, db_dsn: str) -> None:
    """A hard stop while a batch is in flight makes PostgreSQL roll it back: no transition,
    no outbox row, no lock left; a later cycle reaps the batch."""
    seed_three_phases(conn, 5)
    # the test's own brake: writing realtime rows waits for an advisory lock we hold
    conn.execute("CREATE FUNCTION public.brake() RETURNS trigger LANGUAGE plpgsql AS"
                 " $$BEGIN PERFORM pg_advisory_xact_lock(4242); RETURN NULL; END$$")
    conn.execute("CREATE TRIGGER brake AFTER INSERT ON messenger.realtime_outbox"
                 " FOR EACH STATEMENT EXECUTE FUNCTION public.brake()")
    conn.execute("SELECT pg_advisory_lock(4242)")
    guard = StopGuard()
    abandoned = trio.Event()

    async def cycle() -> None:
        with guarded_by(guard), pytest.raises(WorkAbandoned):
            await run_cycle(cfg)
        abandoned.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(cycle)
        await wait_for(lambda: braked_backends(conn) == 1)
        guard.hard_stop()
        with trio.fail_after(10):
            await abandoned.wait()
    await wait_for(lambda: braked_backends(conn) == 0)
    assert counts_by_status(conn) == {"Active": 10, "Provisioning": 5}
    assert outbox_rows(conn) == [] and realtime_rows(conn) == []
    assert_no_row_locks_left(conn)
    conn.execute("DROP TRIGGER brake ON messenger.realtime_outbox")
    conn.execute("SELECT pg_advisory_unlock(4242)")
    counts = await run_cycle(cfg)
    assert counts_of(counts) == {"empty_timeout": 5, "provision_failed": 5, "stale_timeout": 5}


def braked_backends(conn: psycopg.Connection) -> int:
    rows = fetch(conn, "SELECT count(*) AS n FROM pg_locks"
                       " WHERE locktype = 'advisory' AND NOT granted AND objid = 4242")
    return int(rows[0]["n"])


def counts_by_status(conn: psycopg.Connection) -> dict[str, int]:
    rows = fetch(conn, "SELECT status, count(*) AS n FROM messenger.conference_sessions"
                       " GROUP BY status")
    return {r["status"]: r["n"] for r in rows}


async def wait_for(condition: Callable[[], bool], limit: float = 10.0) -> None:
    """Wait until the *server* shows a state (no Trio event can tell us): bounded polling."""
    for _ in range(int(limit / 0.01)):
        if condition():
            return
        await trio.sleep(0.01)
    raise AssertionError("the server never reached the expected state")


async def test_empty_room_closes_within_grace_plus_interval(
        db_dsn: str, conn: psycopg.Connection, media_stub: MediaStub) -> None:  # noqa: F811
    """SLO: run by the lock keeper (grace 1 s, interval 0.5 s), an empty room is closed no
    earlier than last_activity_at + grace and no later than + grace + interval (plus 0.1 s
    for the start-up latency of one cycle)."""
    cfg = make_config(db_dsn, media={"base_url": media_stub.base_url},
                      jobs={"conference_reaper": {"empty_room_grace": "1s",
                                                  "polling_interval": "0.5s"}})
    reaped = trio.Event()
    async with open_database(db_dsn, size=2) as db, open_media_client(cfg.media) as http:
        job = reaper_job(cfg, db, http)

        async def cycle(ctx: CycleContext) -> ReaperCounts:
            counts = await run_reaper_cycle(job, ctx)
            if counts.empty_timeout:
                reaped.set()
            return counts

        locked = LockedJob(JOB, 0.5, 5.0, cycle, first_delay=0.0)
        async with trio.open_nursery() as nursery:
            await nursery.start(serve_lock_keeper, locked, db_dsn)
            conf = insert_conference(conn, last_activity_ago=0.0)
            with trio.fail_after(5):
                await reaped.wait()
            nursery.cancel_scope.cancel()
    row = conference(conn, conf.id)
    waited = (row["ended_at"] - row["last_activity_at"]).total_seconds()
    assert row["end_reason"] == "EmptyTimeout"
    assert 1.0 <= waited <= 1.0 + 0.5 + 0.1


async def test_event_payload_matches_spec_field_by_field(
        cfg: Config, conn: psycopg.Connection) -> None:
    """SPEC §4: exactly the contract's fields; Participants from the roster in join order
    (a lost leave stays null); WasRecorded/RecordingId from the latest recording; absent
    optionals null; ISO-8601 UTC timestamps with Z; no URL."""
    roster = [Participant(role="Host", joined_ago=900, left_ago=130),
              Participant(role="Participant", joined_ago=800, left_ago=None)]
    conf = insert_conference(conn, last_activity_ago=130, started_ago=905,
                             participants=roster, peak=5, tenant_id=None, media_type="Audio")
    insert_conference_recording(conn, conf, status="Available", created_ago=800)
    latest = insert_conference_recording(conn, conf, status="Uploading", created_ago=400)
    await run_cycle(cfg)
    (event,) = outbox_rows(conn, conf.id)
    payload, row = event["payload"], conference(conn, conf.id)
    assert set(payload) == PAYLOAD_KEYS
    assert (payload["ConferenceId"], payload["ChatId"], payload["DealId"]) == (
        conf.id, conf.chat_id, conf.deal_id)
    assert payload["TenantId"] is None
    assert (payload["MediaType"], payload["Status"], payload["EndReason"]) == (
        "Audio", "Ended", "EmptyTimeout")
    assert payload["StartedByUserId"] == conf.started_by_user_id
    assert payload["StartedAt"] == iso(row["started_at"])
    assert payload["EndedAt"] == iso(row["ended_at"])
    assert payload["DurationSeconds"] == row["duration_seconds"] > 0
    assert payload["PeakParticipantCount"] == 5
    people = fetch(conn, "SELECT * FROM messenger.conference_participants"
                         " WHERE conference_id = %s ORDER BY joined_at", conf.id)
    assert payload["Participants"] == [
        {"UserId": str(p["user_id"]), "Role": p["role"], "JoinedAt": iso(p["joined_at"]),
         "LeftAt": iso(p["left_at"])} for p in people]
    assert [p["Role"] for p in payload["Participants"]] == ["Host", "Participant"]
    assert payload["Participants"][1]["LeftAt"] is None
    assert (payload["WasRecorded"], payload["RecordingId"]) == (True, latest)
    assert payload["EndedAt"].endswith("Z") and payload["StartedAt"].endswith("Z")
    assert "http" not in json.dumps(payload)


async def test_payload_without_start_or_recording_has_nulls(
        cfg: Config, conn: psycopg.Connection) -> None:
    """No started_at: StartedAt and DurationSeconds null; no recording, or only a Failed
    one: WasRecorded false and RecordingId null; an empty roster is []."""
    unstarted = insert_conference(conn, last_activity_ago=120, started_ago=None,
                                  started_at=None, created_ago=200)
    conn.execute("UPDATE messenger.conference_sessions SET started_at = NULL WHERE id = %s",
                 (unstarted.id,))
    failed_rec = insert_conference(conn, last_activity_ago=120)
    insert_conference_recording(conn, failed_rec, status="Failed")
    await run_cycle(cfg)
    (first,) = outbox_rows(conn, unstarted.id)
    assert (first["payload"]["StartedAt"], first["payload"]["DurationSeconds"]) == (None, None)
    assert conference(conn, unstarted.id)["duration_seconds"] is None
    assert first["payload"]["Participants"] == []
    assert (first["payload"]["WasRecorded"], first["payload"]["RecordingId"]) == (False, None)
    (second,) = outbox_rows(conn, failed_rec.id)
    assert (second["payload"]["WasRecorded"], second["payload"]["RecordingId"]) == (False, None)


async def test_room_started_after_as_of_is_poison_and_does_not_block_the_batch(
        cfg: Config, conn: psycopg.Connection) -> None:
    """The guard rejects a room whose started_at is after AsOf (negative duration): it is
    logged as item_failed with its id, counted, left Active, and comes back next cycle; the
    rest of the batch commits with its events."""
    ok = [insert_conference(conn, last_activity_ago=120 + n) for n in range(2)]
    poison = insert_conference(conn, last_activity_ago=125, started_ago=-3600)
    before = metric("messenger_conf_reaper_errors_total")
    with structlog.testing.capture_logs() as logs:
        counts = await run_cycle(cfg)
    assert counts_of(counts) == {"empty_timeout": 2, "errors": 1}
    assert conference_statuses(conn)[poison.id] == ("Active", None)
    assert sorted(r["dedupe_key"] for r in outbox_rows(conn)) == sorted(c.id for c in ok)
    (failed,) = [e for e in logs if e["event"] == "item_failed"]
    assert (failed["conference_id"], failed["error"], failed["log_level"]) == (
        poison.id, "started_after_as_of", "error")
    assert metric("messenger_conf_reaper_errors_total") == before + 1
    again = await run_cycle(cfg)
    assert counts_of(again) == {}  # remembered: held out of the claim while backed off
    assert poison_rows(conn) == {poison.id: ("empty-room", 1, "started_after_as_of")}


async def test_row_that_breaks_the_batch_statement_is_isolated_per_row(
        cfg: Config, conn: psycopg.Connection) -> None:
    """A started_at of 0001-01-01 (a default DateTimeOffset leaked by a writer) makes its
    duration overflow: the batch statement fails, the per-row fallback reaps the others
    each in its own savepoint, and the poison is logged, counted and left untouched."""
    ok = [insert_conference(conn, last_activity_ago=120 + n, participants=2)
          for n in range(3)]
    poison = insert_conference(conn, last_activity_ago=130,
                               started_at=dt.datetime(1, 1, 1, tzinfo=dt.UTC))
    with structlog.testing.capture_logs() as logs:
        counts = await run_cycle(cfg)
    assert counts_of(counts) == {"empty_timeout": 3, "errors": 1}
    assert conference_statuses(conn)[poison.id] == ("Active", None)
    assert sorted(r["dedupe_key"] for r in outbox_rows(conn)) == sorted(c.id for c in ok)
    assert len(realtime_rows(conn)) == 3
    (failed,) = [e for e in logs if e["event"] == "item_failed"]
    assert failed["conference_id"] == poison.id
    assert failed["error"].startswith("NumericValueOutOfRange")
    (batch,) = [e for e in logs if e["event"] == "batch_selected"]
    assert (batch["phase"], batch["count"], batch["fallback"]) == ("empty-room", 4, True)


async def test_batch_size_bounds_each_phase_oldest_first_and_backlog_is_reported(
        db_dsn: str, conn: psycopg.Connection, media_stub: MediaStub) -> None:  # noqa: F811
    """At most batch_size rooms per phase and cycle, longest idle first; the backlog gauge
    shows what is left, and the next cycle takes it."""
    cfg = make_config(db_dsn, media={"base_url": media_stub.base_url},
                      jobs={"conference_reaper": {"batch_size": 2}})
    empty = [insert_conference(conn, last_activity_ago=100 + 100 * n) for n in range(3)]
    stale = [insert_conference(conn, last_activity_ago=5 * 3600 + 100 * n,
                               active_participants=1) for n in range(3)]
    first = await run_cycle(cfg)
    assert counts_of(first) == {"empty_timeout": 2, "stale_timeout": 2}
    statuses = conference_statuses(conn)
    assert [statuses[c.id][0] for c in empty] == ["Active", "Ended", "Ended"]
    assert [statuses[c.id][0] for c in stale] == ["Active", "Ended", "Ended"]
    assert metric("messenger_conf_reaper_active_backlog") == 2
    second = await run_cycle(cfg)
    assert counts_of(second) == {"empty_timeout": 1, "stale_timeout": 1}
    assert metric("messenger_conf_reaper_active_backlog") == 0


async def test_cycle_logs_and_metrics_follow_the_seed(
        cfg: Config, conn: psycopg.Connection) -> None:
    """cycle_started (as_of), batch_selected (phase, count), conference_reaped (ids,
    status, end_reason, duration), cycle_completed (counts); run_total{status="ok"},
    items_total{outcome} and the cycle histogram move."""
    conf = insert_conference(conn, last_activity_ago=120, started_ago=720)
    runs = metric("messenger_conf_reaper_run_total", status="ok")
    items = metric("messenger_conf_reaper_items_total", outcome="empty_timeout")
    cycles = metric("messenger_conf_reaper_cycle_duration_seconds_count")
    with structlog.testing.capture_logs() as logs:
        await run_cycle(cfg)
    by_event = {e["event"]: e for e in logs}
    assert "as_of" in by_event["cycle_started"]
    assert (by_event["batch_selected"]["phase"], by_event["batch_selected"]["count"]) == (
        "empty-room", 1)
    reaped = by_event["conference_reaped"]
    assert (reaped["conference_id"], reaped["chat_id"], reaped["deal_id"], reaped["status"],
            reaped["end_reason"]) == (conf.id, conf.chat_id, conf.deal_id, "Ended",
                                      "EmptyTimeout")
    assert reaped["duration_seconds"] == conference(conn, conf.id)["duration_seconds"]
    done = by_event["cycle_completed"]
    assert {k: done[k] for k in SPEC_KEYS - {"duration_ms"}} == {
        "empty_timeout": 1, "provision_failed": 0, "stale_timeout": 0, "skipped_locked": 0,
        "errors": 0}
    assert done["duration_ms"] >= 0
    assert metric("messenger_conf_reaper_run_total", status="ok") == runs + 1
    assert metric("messenger_conf_reaper_items_total", outcome="empty_timeout") == items + 1
    assert metric("messenger_conf_reaper_cycle_duration_seconds_count") == cycles + 1


@pytest.mark.parametrize(("query", "index"), [
    # migration 0009: only empty Active rooms, in the claim's order (not every idle room)
    ("conference_sessions_claim_empty_room", "ix_conf_empty_room"),
    ("conference_sessions_claim_provision_timeout", "ix_conf_provisioning"),
    ("conference_sessions_claim_stale_live", "ix_conf_active")])
def test_claims_can_use_the_partial_index(
        conn: psycopg.Connection, query: str, index: str) -> None:
    """Each phase's predicate implies its partial index's, so the planner can claim
    through it, reading due rooms only (docs/benchmarks.md: 10k vs 100k active)."""
    insert_conference(conn)
    with conn.transaction():
        conn.execute("SET LOCAL enable_seqscan = off")
        plan = conn.execute("EXPLAIN " + ALL_QUERIES[query], {
            "as_of": db_now(conn), "window": 90.0, "batch_size": 100}).fetchall()
    assert index in "\n".join(r[0] for r in plan)


async def test_connection_lost_mid_batch_rolls_it_back_and_ends_the_cycle(
        cfg: Config, conn: psycopg.Connection, media_stub: MediaStub) -> None:  # noqa: F811
    """The server drops the connection while the provision-timeout batch is in flight: that
    batch rolls back whole, later phases do not run, the cycle ends with
    InfrastructureError (not a group) counted as an error run; the empty-room batch
    committed before keeps its events and its recorder still gets the stop signal."""
    seed_three_phases(conn, 3)
    conn.execute("CREATE FUNCTION public.drop_me() RETURNS trigger LANGUAGE plpgsql AS"
                 " $$BEGIN PERFORM pg_terminate_backend(pg_backend_pid()); RETURN NULL; END$$")
    conn.execute("CREATE TRIGGER drop_me AFTER INSERT ON messenger.realtime_outbox"
                 " FOR EACH ROW WHEN (NEW.kind = 'ConferenceSignal')"
                 " EXECUTE FUNCTION public.drop_me()")
    before = metric("messenger_conf_reaper_run_total", status="error")
    with pytest.raises(InfrastructureError):
        await run_cycle(cfg)
    assert counts_by_status(conn) == {"Ended": 3, "Provisioning": 3, "Active": 3}
    assert {e["payload"]["EndReason"] for e in outbox_rows(conn)} == {"EmptyTimeout"}
    assert len(outbox_rows(conn)) == 3
    assert [r["kind"] for r in realtime_rows(conn)] == ["ConferenceEnded"] * 3
    assert len(media_stub.requests) == 3
    assert metric("messenger_conf_reaper_run_total", status="error") == before + 1
    assert_no_row_locks_left(conn)


async def test_cycle_span_has_batch_and_item_spans(
        cfg: Config, conn: psycopg.Connection) -> None:
    """Traces: a cycle span with job_run_id and counts; a batch span per phase; an item
    span per conference (ConferenceId, phase, tenant) under its batch span, poison too."""
    # OpenTelemetry allows one global provider: share the exporter test_tracing installs
    from tests.integration.app.test_tracing import EXPORTER

    reaped = insert_conference(conn, last_activity_ago=120)
    poison = insert_conference(conn, last_activity_ago=120, started_ago=-60, tenant_id=None)
    EXPORTER.clear()
    run_id = str(uuid.uuid4())
    await run_cycle(cfg, run_id=run_id)
    spans = EXPORTER.get_finished_spans()
    (cycle,) = [s for s in spans if s.name == "conference-reaper.cycle"]
    batches = {s.attributes["phase"]: s for s in spans
               if s.name == "conference-reaper.batch" and s.attributes}
    items = {s.attributes["conference_id"]: s for s in spans
             if s.name == "conference-reaper.item" and s.attributes}
    assert cycle.attributes is not None and cycle.attributes["job_run_id"] == run_id
    assert cycle.attributes["empty_timeout"] == 1 and cycle.attributes["errors"] == 1
    assert set(batches) == {"empty-room", "provision-timeout", "stale-live"}
    assert all(b.parent is not None and b.parent.span_id == cycle.context.span_id
               for b in batches.values())
    assert set(items) == {reaped.id, poison.id}
    empty_room = batches["empty-room"]
    for item in items.values():
        assert item.parent is not None and item.parent.span_id == empty_room.context.span_id
    assert items[reaped.id].attributes == {
        "conference_id": reaped.id, "phase": "empty-room", "tenant_id": reaped.tenant_id,
        "outcome": "empty_timeout"}
    poisoned = items[poison.id].attributes
    assert poisoned is not None and "tenant_id" not in poisoned
    assert (poisoned["outcome"], poisoned["error"]) == ("item_failed", "started_after_as_of")


# ------------------------------------------------------------------------ poison memory


def poison_rows(conn: psycopg.Connection) -> dict[str, tuple[str, int, str]]:
    rows = conn.execute("SELECT conference_id, phase, failures, reason"
                        " FROM safetynet.conference_poison").fetchall()
    return {str(r[0]): (r[1], r[2], r[3]) for r in rows}


async def test_batch_size_poison_rows_never_starve_the_healthy_rooms_of_their_phase(
        db_dsn: str, conn: psycopg.Connection, media_stub: MediaStub) -> None:  # noqa: F811
    """batch_size poison rooms, idle longest so claimed first: the healthy due rooms are
    still reaped in the first cycle, the poison is remembered with its reason, stays out
    of the next claims, and `safetynet status` lists it."""
    cfg = make_config(db_dsn, media={"base_url": media_stub.base_url},
                      jobs={"conference_reaper": {"batch_size": 3}})
    poison = [insert_conference(conn, last_activity_ago=900 + n, started_ago=-3600)
              for n in range(2)]
    poison.append(insert_conference(conn, last_activity_ago=950,
                                    started_at=dt.datetime(1, 1, 1, tzinfo=dt.UTC)))
    healthy = [insert_conference(conn, last_activity_ago=120 + n) for n in range(2)]
    first = await run_cycle(cfg)
    assert counts_of(first) == {"empty_timeout": 2, "errors": 3}
    statuses = conference_statuses(conn)
    assert [statuses[c.id][0] for c in healthy] == ["Ended", "Ended"]
    assert [statuses[c.id][0] for c in poison] == ["Active"] * 3
    remembered = poison_rows(conn)
    assert set(remembered) == {c.id for c in poison}
    assert {v[:2] for v in remembered.values()} == {("empty-room", 1)}
    assert remembered[poison[2].id][2].startswith("NumericValueOutOfRange")
    more = [insert_conference(conn, last_activity_ago=100 + n) for n in range(3)]
    with structlog.testing.capture_logs() as logs:
        second = await run_cycle(cfg)
    assert counts_of(second) == {"empty_timeout": 3}  # a full batch, none of it poison
    assert [conference_statuses(conn)[c.id][0] for c in more] == ["Ended"] * 3
    assert not [e for e in logs if e["event"] == "item_failed"]
    assert metric("safetynet_conf_reaper_poisoned") == 3
    current = read_status(conn, cfg)
    assert current.conferences["poisoned"] == 3
    assert {p["conference_id"] for p in current.poisoned} == {c.id for c in poison}
    assert {p["reason"] for p in current.poisoned} >= {"started_after_as_of"}


async def test_released_poison_is_claimed_next_cycle_and_forgotten_once_reaped(
        cfg: Config, conn: psycopg.Connection) -> None:
    """The runbook action: fix the row, `requeue <conference id>`, the next cycle reaps it
    and the poison memory is gone; a room ended elsewhere is forgotten too."""
    poison = insert_conference(conn, last_activity_ago=125, started_ago=-3600)
    ended_elsewhere = insert_conference(conn, last_activity_ago=130, started_ago=-3600)
    assert counts_of(await run_cycle(cfg)) == {"errors": 2}
    conn.execute("UPDATE messenger.conference_sessions SET started_at = now() - interval '1h'"
                 " WHERE id = %s", (poison.id,))
    conn.execute("UPDATE messenger.conference_sessions SET status = 'Ended', ended_at = now()"
                 " WHERE id = %s", (ended_elsewhere.id,))
    assert counts_of(await run_cycle(cfg)) == {}  # fixed, but still backed off
    assert set(poison_rows(conn)) == {poison.id}  # the ended room is forgotten
    (released,) = requeue(conn, [poison.id], all_quarantined=False)
    assert released == Released(poison.id, "empty-room", 1, "started_after_as_of")
    assert counts_of(await run_cycle(cfg)) == {"empty_timeout": 1}
    assert conference_statuses(conn)[poison.id] == ("Ended", "EmptyTimeout")
    assert poison_rows(conn) == {}


def test_poison_back_off_doubles_per_failure_up_to_the_cap(conn: psycopg.Connection) -> None:
    """interval x 2^failures after AsOf, capped; huge failure counts cannot overflow."""
    cid = str(uuid.uuid4())
    as_of = db_now(conn)
    delays = []
    for _ in range(4):
        conn.execute(REAPER_QUERIES["conference_poison_record"], {
            "ids": [cid], "reasons": ["started_after_as_of"], "phase": "empty-room",
            "as_of": as_of, "interval": 30.0, "cap": 200.0})
        (next_at,) = conn.execute("SELECT next_attempt_at FROM safetynet.conference_poison"
                                  " WHERE conference_id = %s", (cid,)).fetchone() or (None,)
        delays.append((next_at - as_of).total_seconds())
    assert delays == [60.0, 120.0, 200.0, 200.0]
    conn.execute("UPDATE safetynet.conference_poison SET failures = 2000000000")
    conn.execute(REAPER_QUERIES["conference_poison_record"], {
        "ids": [cid], "reasons": ["x"], "phase": "empty-room", "as_of": as_of,
        "interval": 30.0, "cap": 200.0})
    assert poison_rows(conn)[cid] == ("empty-room", 2000000001, "x")
