"""The resources the tree shares, each in an exit stack of its own, so a reload can close
and reopen one without touching the others.

>>> async with open_resource_set(cfg) as shared:
...     tree = build_tree(shared.resources(cfg))
...     reopened = await shared.apply(new_cfg)   # between two trees: (Resource.S3,)

A resource belongs to the configuration section of the same name: a change of any key
in ``[s3]`` reopens the object store (a new S3 worker process), ``[postgres]`` the pool,
``[kafka]`` the producer, ``[media]`` the media stack's HTTP client, ``[tracing]`` the
tracer. The asyncio bridge and the relay's wake-up have no settings and live as long as
the set. Resources open in the order of :class:`Resource` and close in reverse.

:meth:`ResourceSet.apply` closes a changed resource before it opens the new one (the
tree that used it has stopped; two pools or two S3 workers never overlap). What can be
checked without connecting was checked when the reload was accepted
(:func:`check_before_reopen`); opening does not connect (the pool connects in the
background, the producer and the S3 worker start on first use), so a server that the new
settings cannot reach shows as it does at start: back-off, ``/readyz`` 503, no exit. (A
CA bundle replaced by garbage between that check and the opening raises
:class:`~supervision.errors.ConfigError` here, which ends the daemon with exit 78 as it
would at start.)

What cancellation does: leaving :func:`open_resource_set` closes every open resource in
reverse order, shielded (each closer bounds itself), and only then: a cancellation from
outside does not reach the holders, so the work inside the set unwinds (its shielded
commits included) with every resource still open. A cancelled
:meth:`ResourceSet.apply` leaves what it already opened in the set, which closes it on
exit; a resource whose opening the cancellation could not interrupt is closed by its
holder at once (nobody got it) and nothing more is opened.
"""

from __future__ import annotations

import enum
import math
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import attrs
import httpx
import structlog
import trio

from actors.kafka.producer import KafkaProducer
from actors.reaper.recorder_signal import open_media_client
from actors.s3.objectstore import ObjectStore
from actors.s3.process import open_object_store
from actors.tracing import open_tracing
from supervision.app.settings import Config
from supervision.app.tree import Resources
from supervision.db.database import Database, open_database
from supervision.db.pgconn import client_deadline, conninfo
from supervision.tls import verifying_context
from supervision.tree.bridge import open_asyncio_bridge
from supervision.tree.wakeup import Wakeup

log = structlog.get_logger("resources")

POOL_SIZE = 6  # claimer + 2 committers + relay + gauges + slack


class Resource(enum.StrEnum):
    """A shared resource, named after its configuration section; opening order."""

    MEDIA = "media"  # first: a CA bundle it cannot load is a ConfigError before the rest
    POSTGRES = "postgres"
    S3 = "s3"
    KAFKA = "kafka"
    TRACING = "tracing"


def changed_resources(old: Config, new: Config) -> tuple[Resource, ...]:
    """The resources whose section differs between *old* and *new*, in opening order."""
    return tuple(r for r in Resource if getattr(old, r.value) != getattr(new, r.value))


def check_before_reopen(new: Config, resources: tuple[Resource, ...]) -> None:
    """Raise :class:`~supervision.errors.ConfigError` for what opening *resources* with
    *new* would refuse: the media CA bundle, read once more (the loader checked every
    certificate file; this catches one replaced since). Reads files: call it in a
    worker thread."""
    if Resource.MEDIA in resources:
        verifying_context(new.media.ca_file, "media.ca_file")


@attrs.define(eq=False)
class _Holding:
    """One open resource: the settings it was opened with and its holder task's events."""

    cfg: Config
    release: trio.Event = attrs.field(factory=trio.Event)  # set: close it
    closed: trio.Event = attrs.field(factory=trio.Event)


@attrs.define(eq=False)
class ResourceSet:
    """The open resources and the settings each was opened with.

    Each resource is opened and closed by a holder task of its own in the set's nursery
    (the S3 store owns a nursery, which must be left by the task that entered it, while
    a reload runs in another task than the start)."""

    _nursery: trio.Nursery
    wakeup: Wakeup = attrs.field(factory=Wakeup)
    _held: dict[Resource, _Holding] = attrs.field(factory=dict)
    _db: Database | None = None
    _store: ObjectStore | None = None
    _producer: KafkaProducer | None = None
    _media_http: httpx.AsyncClient | None = None

    def resources(self, cfg: Config) -> Resources:
        """What the tree built from *cfg* gets (every resource open)."""
        assert self._db and self._store and self._producer and self._media_http
        return Resources(cfg, self._db, self._store, self._producer, self._media_http,
                         self.wakeup)

    async def apply(self, cfg: Config) -> tuple[Resource, ...]:
        """Close the resources whose settings differ from *cfg*'s and open them with
        *cfg*'s; the others stay open. Returns the reopened ones. Call it only while no
        tree runs."""
        changed = tuple(r for r in Resource if r not in self._held
                        or getattr(self._held[r].cfg, r.value) != getattr(cfg, r.value))
        for resource in reversed(changed):
            await self._close(resource)
        for resource in changed:
            holding = _Holding(cfg)
            await self._nursery.start(self._hold, resource, holding)
            self._held[resource] = holding
            # a start cancelled after the opening returns all the same (the holder closed
            # what it opened): open nothing more
            await trio.lowlevel.checkpoint_if_cancelled()
        return changed

    async def aclose(self) -> None:
        for resource in reversed(Resource):
            await self._close(resource)

    async def _close(self, resource: Resource) -> None:
        holding = self._held.pop(resource, None)
        if holding is not None:
            holding.release.set()
            await holding.closed.wait()

    async def _hold(self, resource: Resource, holding: _Holding,
                    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            async with AsyncExitStack() as stack:
                await self._open(resource, holding.cfg, stack)
                task_status.started()
                if trio.current_effective_deadline() == -math.inf:
                    # the start itself was cancelled: trio keeps this task in the start's
                    # nursery, which waits for it, and nobody got the resource; a shielded
                    # wait for a release that comes after the start would never end
                    return
                # closed when released, never by a cancellation reaching the holder: the
                # work using the resource may still be unwinding (a shielded commit), and
                # leaving open_resource_set releases every holder once that work is done
                with trio.CancelScope(shield=True):
                    await holding.release.wait()
        finally:
            holding.closed.set()

    async def _open(self, resource: Resource, cfg: Config, stack: AsyncExitStack) -> None:
        if resource is Resource.MEDIA:
            self._media_http = await stack.enter_async_context(open_media_client(cfg.media))
        elif resource is Resource.POSTGRES:
            pg = cfg.postgres
            self._db = await stack.enter_async_context(open_database(
                conninfo(pg, "safetynet"), size=POOL_SIZE,
                connect_timeout=pg.connect_timeout, deadline=client_deadline(pg)))
        elif resource is Resource.S3:
            self._store = await stack.enter_async_context(open_object_store(cfg.s3))
        elif resource is Resource.KAFKA:
            producer = self._producer = KafkaProducer(cfg.kafka)
            stack.push_async_callback(_stop_producer, producer)
        else:
            await stack.enter_async_context(open_tracing(cfg.tracing))


async def _stop_producer(producer: KafkaProducer) -> None:
    with trio.CancelScope(shield=True), trio.move_on_after(5):
        await producer.stop()


@asynccontextmanager
async def open_resource_set(cfg: Config) -> AsyncIterator[ResourceSet]:
    """Every shared resource opened with *cfg*'s settings, closed on every exit path."""
    async with open_asyncio_bridge(), trio.open_nursery() as nursery:
        shared = ResourceSet(nursery)
        try:
            await shared.apply(cfg)
            yield shared
        finally:
            with trio.CancelScope(shield=True):  # closers bound themselves
                await shared.aclose()
