"""The root's signal handlers: late signals ignored during the teardown after the tree,
and the process's handlers put back afterwards."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from typing import Any

import pytest
import trio

from supervision.runtime import EXIT_OK, SHUTDOWN_SIGNALS, quiet_teardown, serve_root
from supervision.spec import ChildSpec, SupervisorSpec


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
