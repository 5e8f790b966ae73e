"""Entry points behind ``safetynet run`` and ``safetynet run-once``: open the shared
resources, then run the tree (or one cycle) inside them, and map outcomes to exit codes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import structlog

from actors.lock_keeper import LockedJob, _LockConnection, run_locked_cycle
from supervision.config import Config
from supervision.database import open_database
from supervision.objectstore import open_object_store
from supervision.runtime import serve_root
from supervision.tree import Resources, build_tree, locked_jobs

log = structlog.get_logger("app")


def _no_wakeup() -> None:
    return None


@asynccontextmanager
async def open_resources(cfg: Config) -> AsyncIterator[Resources]:
    """The PostgreSQL pool and the S3 client, closed on every exit path."""
    pool_size = 2 + 2 + 2  # claimer + committers + gauges/relay
    async with open_database(cfg.postgres.dsn.reveal(), size=pool_size) as db, \
            open_object_store(cfg.s3) as store:
        yield Resources(cfg, db, store, _no_wakeup)


async def run_daemon(cfg: Config) -> int:
    """``safetynet run``: the supervised tree until SIGTERM/SIGINT. Returns the exit code."""
    async with open_resources(cfg) as res:
        return await serve_root(build_tree(res), cfg.supervision.shutdown_grace)


async def run_once(cfg: Config, job_name: str) -> dict[str, Any]:
    """``safetynet run-once --job J``: one cycle under the job's lock; its counts."""
    async with open_resources(cfg) as res:
        jobs = {job.name: job for job in locked_jobs(res, include_disabled=True)}
        job: LockedJob = jobs[job_name]
        lock = _LockConnection(cfg.postgres.dsn.reveal())
        try:
            outcome = await run_locked_cycle(job, lock)
        finally:
            lock.discard()
    if outcome.status == "ran":
        counts: dict[str, Any] = outcome.result.as_json()
        return counts
    if outcome.status == "skipped_locked":
        return {"lock": "held_elsewhere"}
    raise RuntimeError(f"cycle did not complete: {outcome.status}")
