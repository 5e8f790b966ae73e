"""The process tree, as data. Read this file to know what runs in ``safetynet run``.

    safetynet (one_for_one)
    └── jobs (one_for_one)
        └── lock-keeper:recording-finalize   permanent   cycles: claimer → S3 pool → committers

Resources shared by the actors (the PostgreSQL pool, the S3 client) are opened by the root
before the tree and closed after it (:mod:`supervision.app`); actors get them as
arguments, never as globals.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import attrs

from actors.lock_keeper import LockedJob, serve_lock_keeper
from actors.recording_finalize import FinalizeJob, run_finalize_cycle
from supervision.config import Config
from supervision.database import Database
from supervision.objectstore import ObjectStore
from supervision.spec import ChildSpec, Intensity, Restart, Strategy, SupervisorSpec
from supervision.supervisor import serve_supervisor


@attrs.frozen
class Resources:
    cfg: Config
    db: Database
    store: ObjectStore
    wake_relay: Callable[[], None]


def finalize_job(res: Resources) -> FinalizeJob:
    rf = res.cfg.jobs.recording_finalize
    return FinalizeJob(rf, res.cfg.s3.concurrency, res.db, res.store, res.wake_relay)


def locked_jobs(res: Resources, include_disabled: bool = False) -> list[LockedJob]:
    """The enabled jobs, each with its interval, lock TTL and cycle."""
    jobs = []
    rf = res.cfg.jobs.recording_finalize
    if rf.enabled or include_disabled:
        jobs.append(LockedJob("recording-finalize", rf.polling_interval, rf.lock_ttl,
                              partial(run_finalize_cycle, finalize_job(res))))
    return jobs


def build_tree(res: Resources) -> SupervisorSpec:
    sup = res.cfg.supervision
    intensity = Intensity(max_restarts=sup.max_restarts, window=sup.restart_window,
                          backoff_base=0.5, backoff_cap=min(30.0, sup.restart_window))
    grace = sup.shutdown_grace
    dsn = res.cfg.postgres.dsn.reveal()
    jobs = SupervisorSpec(
        "jobs",
        [ChildSpec(f"lock-keeper:{job.name}", partial(serve_lock_keeper, job, dsn),
                   Restart.PERMANENT, shutdown=grace)
         for job in locked_jobs(res)],
        Strategy.ONE_FOR_ONE, intensity,
    )
    return SupervisorSpec(
        "safetynet",
        [ChildSpec("jobs", partial(serve_supervisor, jobs), Restart.PERMANENT, shutdown=grace)],
        Strategy.ONE_FOR_ONE, intensity,
    )
