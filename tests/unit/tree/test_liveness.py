"""``/healthz`` follows the root supervisor: 503 from the moment it shuts down or
escalates, while its children (the exporter last) are still stopping."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from typing import Any

import attrs
import httpx
import pytest
import trio

from actors.metrics_exporter import Readiness, serve_metrics_exporter
from supervision.tree.health import HEALTH, RootState
from supervision.tree.runtime import EXIT_FAILED, EXIT_OK, serve_root
from supervision.tree.spec import ChildSpec, Intensity, Restart, SupervisorSpec


@pytest.fixture(autouse=True)
def root_health_restored() -> Iterator[None]:
    yield
    HEALTH.set_root(RootState.RUNNING)


async def always_ready() -> None:
    return None


@attrs.define
class Probe:
    """The exporter's port, a child that signals when it is being stopped and holds the
    root's shutdown open until released, and the root's exit code."""

    port: int = 0
    running: trio.Event = attrs.Factory(trio.Event)
    stopping: trio.Event = attrs.Factory(trio.Event)
    release: trio.Event = attrs.Factory(trio.Event)
    exit_code: int | None = None

    async def exporter(self, task_status: Any) -> None:
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(serve_metrics_exporter, "127.0.0.1:0",
                                            Readiness(always_ready, cache_s=0))
            self.port = listeners[0].socket.getsockname()[1]
            task_status.started()

    async def slow_to_stop(self, task_status: Any) -> None:
        task_status.started()
        self.running.set()
        try:
            await trio.sleep_forever()
        finally:
            self.stopping.set()
            with trio.move_on_after(30, shield=True):  # a failed test releases it at once
                await self.release.wait()

    async def run_root(self, tree: SupervisorSpec) -> None:
        self.exit_code = await serve_root(tree, shutdown_grace=60)

    async def get(self, path: str) -> tuple[int, str]:
        async with httpx.AsyncClient() as client:
            resp = await client.get(f"http://127.0.0.1:{self.port}{path}", timeout=5)
        return resp.status_code, resp.text


def children(probe: Probe, *extra: ChildSpec) -> list[ChildSpec]:
    return [ChildSpec("metrics-exporter", probe.exporter, shutdown=5),
            ChildSpec("slow-to-stop", probe.slow_to_stop, shutdown=60), *extra]


async def test_healthz_is_503_from_the_first_signal_until_the_tree_has_stopped() -> None:
    """200 while the tree runs; after SIGTERM, while children are still stopping, both
    /healthz and /readyz answer 503 with the reason."""
    probe = Probe()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(probe.run_root, SupervisorSpec("root", children(probe)))
        try:
            await probe.running.wait()
            assert await probe.get("/healthz") == (200, "ok\n")
            os.kill(os.getpid(), signal.SIGTERM)
            await probe.stopping.wait()
            assert await probe.get("/healthz") == (
                503, "unhealthy: supervisor shutting down (SIGTERM)\n")
            assert (await probe.get("/readyz"))[0] == 503
        finally:
            probe.release.set()
    assert probe.exit_code == EXIT_OK


async def test_healthz_is_503_while_the_root_escalates() -> None:
    """A child beyond the root's restart intensity: while the root stops the others,
    /healthz answers 503 naming the actor; the process then exits 1."""
    probe = Probe()

    async def crash(task_status: Any) -> None:
        task_status.started()
        await probe.running.wait()
        raise RuntimeError("boom")

    tree = SupervisorSpec("root", children(probe, ChildSpec("crasher", crash,
                                                            Restart.PERMANENT)),
                          intensity=Intensity(max_restarts=0))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(probe.run_root, tree)
        try:
            await probe.stopping.wait()
            assert await probe.get("/healthz") == (
                503, "unhealthy: supervisor escalating (crasher exceeded its restart "
                "intensity)\n")
        finally:
            probe.release.set()
    assert probe.exit_code == EXIT_FAILED
