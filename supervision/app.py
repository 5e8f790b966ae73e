"""Entry points behind ``safetynet run`` and ``safetynet run-once``: open the shared
resources, run the tree (or one cycle) inside them, map outcomes to exit codes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import attrs
import trio

from actors.kafka_producer import KafkaProducer
from actors.lock_keeper import CycleOutcome, _LockConnection, run_locked_cycle
from actors.outbox_relay import RelayCounts, run_relay_cycle
from actors.recorder_signal import open_media_client
from supervision.bridge import open_asyncio_bridge
from supervision.config import Config
from supervision.database import open_database
from supervision.errors import ConfigurationFault, InfrastructureError
from supervision.runtime import serve_root
from supervision.s3_process import open_object_store
from supervision.tree import Resources, build_tree, locked_jobs, relay_job, relay_locked_job
from supervision.wakeup import Wakeup

POOL_SIZE = 6  # claimer + 2 committers + relay + gauges + slack


@asynccontextmanager
async def open_resources(cfg: Config) -> AsyncIterator[Resources]:
    """Bridge, PostgreSQL pool, S3 client and Kafka producer, closed on every exit path."""
    async with open_asyncio_bridge(), \
            open_database(cfg.postgres.dsn.reveal(), size=POOL_SIZE) as db, \
            open_object_store(cfg.s3) as store, open_media_client(cfg.media) as media_http:
        producer = KafkaProducer(cfg.kafka)
        try:
            yield Resources(cfg, db, store, producer, media_http, Wakeup())
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(5):
                await producer.stop()


async def run_daemon(cfg: Config) -> int:
    """``safetynet run``: the supervised tree until SIGTERM/SIGINT. Returns the exit code."""
    async with open_resources(cfg) as res:
        return await serve_root(build_tree(res), cfg.supervision.shutdown_grace)


async def run_once(cfg: Config, job_name: str) -> dict[str, Any]:
    """``safetynet run-once --job J``: one cycle under the job's lock; its counts.

    For the outbox relay, cycles repeat until nothing publishable is left."""
    async with open_resources(cfg) as res:
        lock = _LockConnection(cfg.postgres.dsn.reveal())
        try:
            if job_name == "outbox-relay":
                return await _drain_relay(res, lock)
            jobs = {job.name: job for job in locked_jobs(res, include_disabled=True)}
            outcome = await run_locked_cycle(jobs[job_name], lock)
        finally:
            lock.discard()
    return _counts(outcome)


async def _drain_relay(res: Resources, lock: _LockConnection) -> dict[str, Any]:
    relay = relay_job(res)
    job = attrs.evolve(relay_locked_job(res), cycle=partial(run_relay_cycle, relay))
    total = RelayCounts()
    while True:
        outcome = await run_locked_cycle(job, lock)
        if outcome.status != "ran":
            return _counts(outcome)
        counts: RelayCounts = outcome.result
        total.published += counts.published
        total.failed += counts.failed
        total.duration_ms += counts.duration_ms
        if relay.state.kafka_failures:
            raise InfrastructureError("kafka: unreachable; rows stay unpublished")
        if counts.published == 0:
            fault = relay.state.fault_reason()
            if fault is not None:
                raise ConfigurationFault(f"kafka: {fault}; their rows stay unpublished")
            return total.as_json()


def _counts(outcome: CycleOutcome) -> dict[str, Any]:
    if outcome.status == "ran":
        counts: dict[str, Any] = outcome.result.as_json()
        return counts
    if outcome.status == "skipped_locked":
        return {"lock": "held_elsewhere"}
    raise InfrastructureError(f"cycle did not complete: {outcome.status}")
