"""The root's signal handlers: late signals ignored during the teardown after the tree,
and the process's handlers put back afterwards."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from supervision.tree.runtime import (
    EXIT_OK,
    SHUTDOWN_SIGNALS,
    Successor,
    quiet_teardown,
    serve_root,
)
from supervision.tree.shielding import must_complete
from supervision.tree.spec import ChildSpec, SupervisorSpec


def handlers() -> dict[int, Any]:
    return {signum: signal.getsignal(signum) for signum in SHUTDOWN_SIGNALS}


@pytest.fixture(autouse=True)
def handlers_restored() -> Iterator[None]:
    """Whatever a failing test leaves behind, the test process keeps its own handlers."""
    before = handlers()
    yield
    for signum, handler in before.items():
        signal.signal(signum, handler)


async def serve_until_sigterm() -> int:
    """serve_root with one idle child, stopped by a real SIGTERM once it runs."""
    running = trio.Event()

    async def idle(task_status: Any) -> None:
        task_status.started()
        running.set()
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        async def sigterm_once_running() -> None:
            await running.wait()
            os.kill(os.getpid(), signal.SIGTERM)

        nursery.start_soon(sigterm_once_running)
        return await serve_root(SupervisorSpec("root", [ChildSpec("idle", idle)]), 60)


async def test_serve_root_leaves_the_signal_handlers_as_it_found_them() -> None:
    """After serve_root returns, SIGTERM and SIGINT do again what they did before."""
    before = handlers()
    assert await serve_until_sigterm() == EXIT_OK
    assert handlers() == before


async def test_late_signals_are_ignored_until_the_quiet_teardown_ends() -> None:
    """Inside quiet_teardown, once the tree stopped, SIGTERM/SIGINT are ignored (pools
    close in peace); when the block exits, the previous handlers are back."""
    before = handlers()
    with quiet_teardown():
        assert await serve_until_sigterm() == EXIT_OK
        assert handlers() == dict.fromkeys(SHUTDOWN_SIGNALS, signal.SIG_IGN)
    assert handlers() == before


def sighup_handler_restored() -> Any:
    return signal.getsignal(signal.SIGHUP)


async def test_sighup_swaps_the_tree_after_stopping_the_old_one_gracefully() -> None:
    """SIGHUP: the old tree's must-complete work in flight finishes, its children stop,
    then the successor reload returned runs (it may swap resources) and the tree it
    builds starts; SIGTERM then stops it with 0."""
    order: list[str] = []
    running = {"old": trio.Event(), "new": trio.Event()}
    reloaded, release = trio.Event(), trio.Event()

    def child(name: str) -> Any:
        async def serve(task_status: Any) -> None:
            task_status.started()
            order.append(f"{name} started")
            try:
                async with must_complete():
                    running[name].set()
                    if name == "old":
                        await release.wait()  # in flight when the reload lands
                    order.append(f"{name} committed")
                await trio.sleep_forever()
            finally:
                order.append(f"{name} stopped")
        return serve

    async def successor() -> SupervisorSpec:
        order.append("resources swapped")
        return SupervisorSpec("root", [ChildSpec("new", child("new"))])

    async def reload() -> Successor | None:
        order.append("reload")
        reloaded.set()
        return successor

    before = sighup_handler_restored()
    async with trio.open_nursery() as nursery:
        async def drive() -> None:
            await running["old"].wait()
            os.kill(os.getpid(), signal.SIGHUP)
            await reloaded.wait()
            await trio.testing.wait_all_tasks_blocked()
            release.set()
            await running["new"].wait()
            os.kill(os.getpid(), signal.SIGTERM)

        nursery.start_soon(drive)
        code = await serve_root(SupervisorSpec("root", [ChildSpec("old", child("old"))]),
                                60, reload)
    assert code == EXIT_OK
    assert order == ["old started", "reload", "old committed", "old stopped",
                     "resources swapped", "new started", "new committed", "new stopped"]
    assert sighup_handler_restored() == before


async def test_a_refused_reload_leaves_the_tree_running() -> None:
    """When reload returns None (invalid or unchanged configuration) nothing restarts."""
    starts: list[int] = []
    reloaded, running = trio.Event(), trio.Event()

    async def serve(task_status: Any) -> None:
        starts.append(1)
        task_status.started()
        running.set()
        await trio.sleep_forever()

    async def reload() -> Successor | None:
        reloaded.set()
        return None

    async with trio.open_nursery() as nursery:
        async def drive() -> None:
            await running.wait()
            os.kill(os.getpid(), signal.SIGHUP)
            await reloaded.wait()
            await trio.testing.wait_all_tasks_blocked()
            os.kill(os.getpid(), signal.SIGTERM)

        nursery.start_soon(drive)
        code = await serve_root(SupervisorSpec("root", [ChildSpec("only", serve)]), 60,
                                reload)
    assert code == EXIT_OK and starts == [1]


async def test_a_sighup_while_the_successor_runs_is_applied_after_it() -> None:
    """A second SIGHUP lands while the first reload's successor is swapping resources:
    its successor runs right after, and the tree it builds is the one that starts."""
    started: list[str] = []
    reloads, first_swapping, release = [0], trio.Event(), trio.Event()
    old_running, new_running = trio.Event(), trio.Event()

    def child(name: str) -> Any:
        async def serve(task_status: Any) -> None:
            task_status.started()
            started.append(name)
            (old_running if name == "old" else new_running).set()
            await trio.sleep_forever()
        return serve

    def successor_of(name: str) -> Successor:
        async def successor() -> SupervisorSpec:
            if name == "first":
                first_swapping.set()
                await release.wait()
            return SupervisorSpec("root", [ChildSpec(name, child(name))])
        return successor

    async def reload() -> Successor | None:
        reloads[0] += 1
        return successor_of("first" if reloads[0] == 1 else "second")

    async with trio.open_nursery() as nursery:
        async def drive() -> None:
            await old_running.wait()
            os.kill(os.getpid(), signal.SIGHUP)
            await first_swapping.wait()
            os.kill(os.getpid(), signal.SIGHUP)
            while reloads[0] < 2:
                await trio.testing.wait_all_tasks_blocked()
            release.set()
            await new_running.wait()  # the first tree after the old one, whichever
            os.kill(os.getpid(), signal.SIGTERM)

        nursery.start_soon(drive)
        code = await serve_root(SupervisorSpec("root", [ChildSpec("old", child("old"))]),
                                60, reload)
    assert code == EXIT_OK and started == ["old", "second"]


def test_safetynet_run_freezes_its_startup_objects_before_the_tree_starts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`safetynet run` hides what it imported and loaded from the garbage collector before
    the daemon starts, so a full collection does not stall the loop walking it."""
    import gc

    from click.testing import CliRunner

    from supervision.app import daemon
    from supervision.app.cli import main

    seen: list[int] = []

    async def fake_daemon(*_args: object) -> int:
        seen.append(gc.get_freeze_count())
        return 0

    monkeypatch.setattr(daemon, "run_daemon", fake_daemon)
    config = tmp_path / "c.toml"
    config.write_text('[postgres]\ndsn = "host=127.0.0.1 port=9 dbname=m"\n')
    gc.unfreeze()
    try:
        result = CliRunner().invoke(main, ["run", "-c", str(config)])
    finally:
        gc.unfreeze()
    assert result.exit_code == 0, result.output
    assert len(seen) == 1 and seen[0] > 10_000  # the modules, classes and functions


async def test_sigterm_while_a_reload_hangs_stops_the_daemon_at_once() -> None:
    """A reload that never returns (a file that blocks its reader) does not keep the
    signal loop from handling SIGTERM: the reload is abandoned and serve_root returns 0
    well within the shutdown grace."""
    running, reloading = trio.Event(), trio.Event()

    async def serve(task_status: Any) -> None:
        task_status.started()
        running.set()
        await trio.sleep_forever()

    async def reload() -> Successor | None:
        reloading.set()
        await trio.sleep_forever()
        return None

    async with trio.open_nursery() as nursery:
        async def drive() -> None:
            await running.wait()
            os.kill(os.getpid(), signal.SIGHUP)
            await reloading.wait()
            os.kill(os.getpid(), signal.SIGTERM)

        nursery.start_soon(drive)
        with trio.fail_after(5):  # the grace is 60 s
            code = await serve_root(SupervisorSpec("root", [ChildSpec("only", serve)]), 60,
                                    reload)
    assert code == EXIT_OK


async def test_sighups_during_a_reload_run_one_more_reload_after_it() -> None:
    """Three SIGHUPs while a reload runs: the reloads never overlap, and exactly one more
    runs after the first (the file is read again once)."""
    running, first_started, release, second_done = (trio.Event() for _ in range(4))
    calls: list[int] = []
    active = [0]

    async def serve(task_status: Any) -> None:
        task_status.started()
        running.set()
        await trio.sleep_forever()

    async def reload() -> Successor | None:
        active[0] += 1
        assert active[0] == 1, "reloads overlap"
        calls.append(1)
        first_started.set()
        await release.wait()
        active[0] -= 1
        if len(calls) == 2:
            second_done.set()
        return None

    async with trio.open_nursery() as nursery:
        async def drive() -> None:
            await running.wait()
            os.kill(os.getpid(), signal.SIGHUP)
            await first_started.wait()
            for _ in range(3):
                os.kill(os.getpid(), signal.SIGHUP)
                await trio.testing.wait_all_tasks_blocked()
            release.set()
            await second_done.wait()
            await trio.testing.wait_all_tasks_blocked()
            os.kill(os.getpid(), signal.SIGTERM)

        nursery.start_soon(drive)
        code = await serve_root(SupervisorSpec("root", [ChildSpec("only", serve)]), 60,
                                reload)
    assert code == EXIT_OK and len(calls) == 2
