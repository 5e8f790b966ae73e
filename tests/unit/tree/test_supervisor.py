"""Supervisor strategies, restart types, intensity, back-off and shutdown (fake clock)."""

from __future__ import annotations

import itertools
from collections import Counter
from functools import partial

import pytest
import trio
import trio.testing

from supervision.metrics import ACTOR_RESTARTS
from supervision.tree.shielding import must_complete
from supervision.tree.spec import ChildSpec, Intensity, Restart, Strategy, SupervisorSpec
from supervision.tree.supervisor import RestartIntensityExceeded, serve_supervisor


class Boom(Exception):
    pass


class Recorder:
    """Counts starts per child and records events in order."""

    def __init__(self) -> None:
        self.starts: Counter[str] = Counter()
        self.events: list[str] = []
        self.start_times: dict[str, list[float]] = {}

    async def actor(self, name: str, *, crash_times: int = 0, exit_normally: bool = False,
                    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self.starts[name] += 1
        self.start_times.setdefault(name, []).append(trio.current_time())
        task_status.started()
        self.events.append(f"start {name}")
        try:
            await trio.sleep(1)
            if self.starts[name] <= crash_times:
                raise Boom(f"{name} crashed")
            if exit_normally:
                return
            await trio.sleep_forever()
        finally:
            self.events.append(f"stop {name}")

    def child(self, name: str, restart: Restart = Restart.PERMANENT, **kw: object) -> ChildSpec:
        return ChildSpec(name, partial(self.actor, name, **kw), restart, shutdown=1.0)


async def run_for(spec: SupervisorSpec, seconds: float) -> None:
    with trio.move_on_after(seconds):
        await serve_supervisor(spec)


FAST = Intensity(max_restarts=3, window=60, backoff_base=0.1, backoff_cap=1.0)


async def test_one_for_one_restarts_only_the_crashed_child(autojump_clock: object) -> None:
    """A crash restarts that child alone; its siblings keep running."""
    rec = Recorder()
    spec = SupervisorSpec("sup", [rec.child("a"), rec.child("b", crash_times=1),
                                  rec.child("c")], Strategy.ONE_FOR_ONE, FAST)
    await run_for(spec, 10)
    assert rec.starts == {"a": 1, "b": 2, "c": 1}


async def test_one_for_all_restarts_every_child(autojump_clock: object) -> None:
    """A crash restarts all children, the others stopped in reverse order first."""
    rec = Recorder()
    spec = SupervisorSpec("sup", [rec.child("a"), rec.child("b", crash_times=1),
                                  rec.child("c")], Strategy.ONE_FOR_ALL, FAST)
    await run_for(spec, 10)
    assert rec.starts == {"a": 2, "b": 2, "c": 2}
    crash = rec.events.index("stop b")
    assert rec.events[crash:crash + 6] == [
        "stop b", "stop c", "stop a", "start a", "start b", "start c"]


async def test_rest_for_one_restarts_the_crashed_child_and_later_ones(
        autojump_clock: object) -> None:
    """Children started before the crashed one are untouched."""
    rec = Recorder()
    spec = SupervisorSpec("sup", [rec.child("a"), rec.child("b", crash_times=1),
                                  rec.child("c")], Strategy.REST_FOR_ONE, FAST)
    await run_for(spec, 10)
    assert rec.starts == {"a": 1, "b": 2, "c": 2}


async def test_transient_child_restarts_only_after_an_error(autojump_clock: object) -> None:
    """A transient child that returns stays down; one that raises comes back."""
    rec = Recorder()
    spec = SupervisorSpec("sup", [
        rec.child("done", Restart.TRANSIENT, exit_normally=True),
        rec.child("flaky", Restart.TRANSIENT, crash_times=1),
    ], Strategy.ONE_FOR_ONE, FAST)
    await run_for(spec, 10)
    assert rec.starts == {"done": 1, "flaky": 2}


async def test_temporary_child_is_never_restarted(autojump_clock: object) -> None:
    """A temporary child that crashes is dropped; the supervisor keeps the others."""
    rec = Recorder()
    spec = SupervisorSpec("sup", [rec.child("once", Restart.TEMPORARY, crash_times=5),
                                  rec.child("steady")], Strategy.ONE_FOR_ALL, FAST)
    await run_for(spec, 10)
    assert rec.starts == {"once": 1, "steady": 1}


async def test_permanent_child_restarts_even_after_normal_exit(autojump_clock: object) -> None:
    """Permanent means always: a child that returns is started again."""
    rec = Recorder()
    spec = SupervisorSpec("sup", [rec.child("loop", exit_normally=True)], Strategy.ONE_FOR_ONE,
                          Intensity(max_restarts=100, window=1000, backoff_cap=0.5))
    await run_for(spec, 5.5)
    assert rec.starts["loop"] >= 4


async def test_intensity_exceeded_escalates_with_actor_and_last_error(
        autojump_clock: object) -> None:
    """max_restarts restarts inside the window, then the supervisor fails."""
    rec = Recorder()
    spec = SupervisorSpec("sup", [rec.child("ok"), rec.child("bad", crash_times=99)],
                          Strategy.ONE_FOR_ONE, FAST)
    with pytest.raises(RestartIntensityExceeded) as info:
        await serve_supervisor(spec)
    assert rec.starts["bad"] == FAST.max_restarts + 1
    assert info.value.actor == "bad"
    assert "Boom: bad crashed" in str(info.value)
    assert rec.events[-1] == "stop ok", "the surviving children are stopped before failing"


async def test_restarts_outside_the_window_do_not_accumulate(autojump_clock: object) -> None:
    """Crashes spaced wider than the window never exceed the intensity."""
    rec = Recorder()

    async def slow_crasher(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                           ) -> None:
        rec.starts["slow"] += 1
        task_status.started()
        await trio.sleep(30)
        raise Boom("again")

    spec = SupervisorSpec("sup", [ChildSpec("slow", slow_crasher)], Strategy.ONE_FOR_ONE,
                          Intensity(max_restarts=1, window=20))
    await run_for(spec, 200)
    assert rec.starts["slow"] >= 6


async def test_backoff_between_restarts_is_jittered_within_the_growing_window(
        autojump_clock: object) -> None:
    """The n-th restart in the window waits a time drawn from [0, min(cap, base * 2^(n-1))]
    (full jitter): every wait stays inside its window, and the waits are not one fixed
    sequence (consecutive capped waits differ)."""
    rec = Recorder()
    intensity = Intensity(max_restarts=50, window=10_000, backoff_base=1.0, backoff_cap=4.0)
    spec = SupervisorSpec("sup", [rec.child("bad", crash_times=99)], Strategy.ONE_FOR_ONE,
                          intensity)
    await run_for(spec, 120)
    times = rec.start_times["bad"]
    # each run lasts 1 s before crashing, then the back-off
    waits = [b - a - 1.0 for a, b in itertools.pairwise(times)]
    assert len(waits) >= 20
    ceilings = [intensity.ceiling(n) for n in range(1, len(waits) + 1)]
    assert ceilings[:4] == [1.0, 2.0, 4.0, 4.0]
    for wait, ceiling in zip(waits, ceilings, strict=True):
        assert -1e-6 <= wait <= ceiling + 1e-6
    capped = waits[3:]
    assert len({round(w, 6) for w in capped}) > len(capped) // 2, capped
    assert sum(capped) / len(capped) < 3.5, "full jitter averages half the cap, not the cap"


def test_intensity_delay_is_zero_before_any_restart_and_bounded_after() -> None:
    """No restart in the window: restart at once; afterwards the draw never passes the
    window's top and spreads over it."""
    intensity = Intensity(backoff_base=0.5, backoff_cap=2.0)
    assert intensity.delay(0) == 0.0 and intensity.ceiling(0) == 0.0
    draws = [intensity.delay(4) for _ in range(2_000)]
    assert all(0.0 <= d <= 2.0 for d in draws)
    assert min(draws) < 0.2 and max(draws) > 1.8


async def test_nested_supervisor_escalation_is_a_child_failure_of_the_parent(
        autojump_clock: object) -> None:
    """An inner supervisor beyond its intensity is restarted by the outer one, which
    escalates in turn and names the innermost actor."""
    rec = Recorder()
    inner = SupervisorSpec("inner", [rec.child("leaf", crash_times=99)], Strategy.ONE_FOR_ONE,
                           Intensity(max_restarts=1, window=100, backoff_base=0.1))
    outer = SupervisorSpec("outer", [rec.child("sibling"),
                                     ChildSpec("inner", partial(serve_supervisor, inner))],
                           Strategy.ONE_FOR_ONE,
                           Intensity(max_restarts=2, window=100, backoff_base=0.1))
    with pytest.raises(RestartIntensityExceeded) as info:
        await serve_supervisor(outer)
    assert info.value.supervisor == "outer" and info.value.child == "inner"
    assert info.value.actor == "leaf"
    assert rec.starts["leaf"] == 3 * 2  # (1 + 1 restart) per inner incarnation, 3 of them
    assert rec.starts["sibling"] == 1


async def test_restarts_are_counted_per_actor(autojump_clock: object) -> None:
    """safetynet_actor_restarts_total{actor} moves by the number of restarts."""
    before = ACTOR_RESTARTS.labels(actor="counted")._value.get()
    rec = Recorder()
    spec = SupervisorSpec("sup", [rec.child("counted", crash_times=2)], Strategy.ONE_FOR_ONE,
                          FAST)
    await run_for(spec, 10)
    assert ACTOR_RESTARTS.labels(actor="counted")._value.get() - before == 2


async def test_shutdown_stops_children_in_reverse_start_order(autojump_clock: object) -> None:
    """Cancelling the supervisor stops c, then b, then a, and restarts none."""
    rec = Recorder()
    spec = SupervisorSpec("sup", [rec.child("a"), rec.child("b"), rec.child("c")])
    await run_for(spec, 5)
    assert rec.events == ["start a", "start b", "start c", "stop c", "stop b", "stop a"]
    assert rec.starts == {"a": 1, "b": 1, "c": 1}


async def test_child_hanging_past_its_budget_is_hard_stopped(autojump_clock: object) -> None:
    """A must-complete block that never ends is aborted once the shutdown budget is spent,
    and the whole shutdown takes the budget, not longer."""
    outcome: list[str] = []

    async def stuck(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        try:
            async with must_complete():
                await trio.sleep(10_000)
                outcome.append("completed")
        finally:
            outcome.append("exited")

    spec = SupervisorSpec("sup", [ChildSpec("stuck", stuck, shutdown=3.0)])
    async with trio.open_nursery() as nursery:
        await nursery.start(serve_supervisor, spec)
        await trio.sleep(1)
        cancelled_at = trio.current_time()
        nursery.cancel_scope.cancel()
    assert trio.current_time() - cancelled_at == pytest.approx(3.0)
    assert outcome == ["exited"]


async def test_soft_stop_lets_a_must_complete_block_finish(autojump_clock: object) -> None:
    """A block shorter than the budget runs to its end despite the cancel."""
    outcome: list[str] = []

    async def committing(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                         ) -> None:
        task_status.started()
        async with must_complete():
            await trio.sleep(2)
            outcome.append("committed")
        outcome.append("after")  # not reached: the cancel lands at the next checkpoint
        await trio.sleep(1)
        outcome.append("never")

    spec = SupervisorSpec("sup", [ChildSpec("c", committing, shutdown=5.0)])
    async with trio.open_nursery() as nursery:
        await nursery.start(serve_supervisor, spec)
        await trio.sleep(1)
        nursery.cancel_scope.cancel()
    assert outcome == ["committed", "after"]


async def test_child_failing_before_ready_counts_as_a_crash(autojump_clock: object) -> None:
    """start() never hangs on a child that dies during start-up; it is restarted."""
    starts = Counter[str]()

    async def broken_start(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                           ) -> None:
        starts["x"] += 1
        if starts["x"] == 1:
            raise Boom("cannot start")
        task_status.started()
        await trio.sleep_forever()

    await run_for(SupervisorSpec("sup", [ChildSpec("x", broken_start)], intensity=FAST), 5)
    assert starts["x"] == 2


class SlowStarters:
    """Children that take a second to get ready, then serve until stopped. The ones
    running (ready or not) are in ``live``; :meth:`abandon` kills them and any started
    later, so that a supervisor that failed to stop them still returns."""

    def __init__(self) -> None:
        self.live: dict[trio.CancelScope, str] = {}
        self.entered_at: list[float] = []
        self.crashed: set[str] = set()
        self.abandoned = False

    def abandon(self) -> list[str]:
        self.abandoned = True
        left = list(self.live.values())
        for scope in self.live:
            scope.cancel()
        return left

    async def actor(self, name: str, *, crash_once: bool = False,
                    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self.entered_at.append(trio.current_time())
        with trio.CancelScope() as scope:
            if self.abandoned:
                scope.cancel()
            self.live[scope] = name
            try:
                await trio.sleep(1)
                task_status.started()
                await trio.sleep(1.5)
                if crash_once and name not in self.crashed:
                    self.crashed.add(name)
                    raise Boom(f"{name} crashed")
                await trio.sleep_forever()
            finally:
                del self.live[scope]

    def child(self, name: str, **kw: object) -> ChildSpec:
        return ChildSpec(name, partial(self.actor, name, **kw), shutdown=1.0)


# a starts over [0, 1), b over [1, 2), c over [2, 3); b crashes at 3.5 and, after a 0.1 s
# back-off, starts again over [3.6, 4.6)
@pytest.mark.parametrize("cancel_at", [0.0, 0.5, 1.5, 2.5, 3.25, 3.55, 4.0, 5.0])
async def test_cancel_at_any_moment_of_start_up_stops_every_child(
        autojump_clock: object, cancel_at: float) -> None:
    """Cancelled while a child is still getting ready (or at any other moment), the
    supervisor stops every child it started, ready or not, within their budgets, and
    starts no new one."""
    kids = SlowStarters()
    spec = SupervisorSpec("sup", [kids.child("a"), kids.child("b", crash_once=True),
                                  kids.child("c")], Strategy.ONE_FOR_ONE, FAST)
    left_running: list[str] = []
    async with trio.open_nursery() as nursery:

        async def watchdog() -> None:
            await trio.sleep(cancel_at + 60)
            left_running.extend(kids.abandon())  # a hung supervisor returns: the test fails

        nursery.start_soon(watchdog)
        with trio.move_on_after(cancel_at):
            await serve_supervisor(spec)
        nursery.cancel_scope.cancel()
    assert left_running == []
    assert kids.live == {}
    assert max(kids.entered_at) <= cancel_at


def test_duplicate_child_names_are_rejected() -> None:
    """Child names identify actors in logs and metrics, so they must be unique."""
    rec = Recorder()
    with pytest.raises(ValueError, match="duplicate child names"):
        SupervisorSpec("sup", [rec.child("a"), rec.child("a")])
