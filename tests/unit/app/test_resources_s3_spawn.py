"""The resource set's S3 store outlives the cycle that uses it, even when a cancellation
from outside lands while a request of that cycle is spawning the S3 worker.

The worker is started by the first request, in the requesting task, and its spawn runs in
a thread trio cannot interrupt. When the resource holders closed as soon as an outside
cancellation reached them, the store closed while that spawn went on; the spawn then
handed its worker to the store's closed nursery ("Nursery is closed to new arrivals"),
which ended the cancelled cycle of
``test_cancelled_cycle_leaves_every_recording_whole_or_untouched[0.45]`` and, from the
same cause, ``safetynet dev --deadline`` without its summary (exit 1, no SUMMARY line).
Both reproduce every time with a spawn held open across the cancellation, as here. The
holders now close only once released, after the work in the set has unwound
(:mod:`supervision.app.resources`); the store's own guard (a worker whose spawn outlasts
the store is killed, tests/unit/s3/test_s3_process.py) is the second line.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import pytest
import trio
import trio.testing

from supervision.app import resources as resources_module
from supervision.app.resources import Resource, ResourceSet, open_resource_set
from supervision.app.settings import Config
from tests.conftest import make_config

CFG = make_config("postgresql://safetynet@127.0.0.1:9/none",
                  s3={"endpoint_url": "http://127.0.0.1:9", "access_key_id": "AKIDFAKE",
                      "secret_access_key": "fake-secret-value"})


@asynccontextmanager
async def _no_bridge() -> AsyncIterator[None]:
    yield None


@pytest.fixture
def only_the_s3_store(monkeypatch: pytest.MonkeyPatch) -> None:
    """The set opens its real S3 store (and worker) and nothing else."""
    real_open = ResourceSet._open

    async def open_s3_only(self: ResourceSet, resource: Resource, cfg: Config,
                           stack: AsyncExitStack) -> None:
        if resource is Resource.S3:
            await real_open(self, resource, cfg, stack)

    monkeypatch.setattr(ResourceSet, "_open", open_s3_only)
    monkeypatch.setattr(resources_module, "open_asyncio_bridge", _no_bridge)


async def test_an_outer_cancel_during_the_s3_worker_spawn_leaves_the_store_open(
        only_the_s3_store: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cycle's first HEAD is spawning the S3 worker when a cancellation from outside
    comes: the spawn ends with the store still open, so the worker becomes the store's
    (counted, not killed as an orphan, not handed to a closed nursery), and it leaves
    with the store, after the cycle has unwound, on the end of its input."""
    spawning, release = trio.Event(), trio.Event()
    spawned: list[trio.Process] = []
    real_open_process = trio.lowlevel.open_process

    async def held_open_process(*args: Any, **kwargs: Any) -> trio.Process:
        spawning.set()
        with trio.CancelScope(shield=True):  # as the real spawn: a thread, run to its end
            await release.wait()
            process = await real_open_process(*args, **kwargs)
        spawned.append(process)
        return process

    monkeypatch.setattr(trio.lowlevel, "open_process", held_open_process)
    with trio.CancelScope() as outside:
        async with open_resource_set(CFG) as shared:
            store = shared._store
            assert store is not None

            async def first_head() -> None:
                await store.head_recording("r1")

            async with trio.open_nursery() as cycle:
                cycle.start_soon(first_head)
                await spawning.wait()
                outside.cancel()
                with trio.CancelScope(shield=True):
                    await trio.testing.wait_all_tasks_blocked()  # the holders saw it
                    release.set()
    assert outside.cancelled_caught
    assert store.starts == 1  # the spawn ended with the store open
    (process,) = spawned
    assert process.returncode == 0  # exited on the end of its input, not killed
