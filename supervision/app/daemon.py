"""Entry points behind ``safetynet run`` and ``safetynet run-once``: open the shared
resources, run the tree (or one cycle) inside them, map outcomes to exit codes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import attrs
import structlog

from actors.leases.lease import LockConnection
from actors.leases.lock_keeper import CycleOutcome, CycleStatus, run_locked_cycle
from actors.outbox.relay import run_relay_until_drained
from supervision.app.reload import reloader
from supervision.app.resources import ResourceSet, open_resource_set
from supervision.app.schema_gate import GATE_FAULT, PendingGate, check_job, schema_gate
from supervision.app.settings import Config
from supervision.app.tree import Resources, build_tree, locked_jobs, relay_job, relay_locked_job
from supervision.db.pgconn import client_deadline, conninfo
from supervision.errors import InfrastructureError
from supervision.jobs import Job
from supervision.tree.health import HEALTH
from supervision.tree.runtime import Successor, quiet_teardown, serve_root
from supervision.tree.spec import SupervisorSpec

log = structlog.get_logger("daemon")


@asynccontextmanager
async def open_resources(cfg: Config) -> AsyncIterator[Resources]:
    """Bridge, media client, PostgreSQL pool, S3 client, Kafka producer and tracer,
    closed on every exit path (:mod:`supervision.app.resources`).

    The media client comes first: a CA bundle it cannot load (``media.ca_file``) is a
    :class:`~supervision.errors.ConfigError` before anything else starts."""
    async with open_resource_set(cfg) as shared:
        yield shared.resources(cfg)


async def run_daemon(cfg: Config, load: Callable[[], Config] | None = None) -> int:
    """``safetynet run``: the supervised tree until SIGTERM/SIGINT. Returns the exit code.

    With *load* (re-reads the configuration; raises ``ConfigError``), SIGHUP rebuilds the
    tree from what it returns; between the old tree and the new one, the resources whose
    settings changed are closed and opened anew, the others stay open
    (:mod:`supervision.app.reload`). A SIGHUP with nothing to apply checks the schema
    again all the same, and rebuilds the tree when the verdict changed (a column mended:
    its job starts)."""
    with quiet_teardown():
        async with open_resource_set(cfg) as shared:
            trees = _Trees(shared, cfg)
            reload = None
            if load is not None:
                next_config = reloader(cfg, load)

                async def reload() -> Successor | None:
                    new = await next_config()
                    if new is None:
                        return await trees.recheck()

                    async def successor() -> SupervisorSpec:
                        reopened = await shared.apply(new)
                        if reopened:
                            log.info("resources_reopened", resources=list(reopened))
                        trees.cfg = new
                        return await trees.gated()
                    return successor
            return await serve_root(await trees.gated(), cfg.supervision.shutdown_grace,
                                    reload)


@attrs.define
class _Trees:
    """Builds each tree after the schema check, and remembers what the running one was
    built on (its configuration, the jobs its verdict left out, or its pending check)."""

    shared: ResourceSet
    cfg: Config
    excluded: frozenset[str] = frozenset()
    gate: PendingGate | None = None

    async def gated(self) -> SupervisorSpec:
        """The tree after the schema check: without the jobs it excludes, or, when
        PostgreSQL did not answer it, with every job waiting for the check to pass
        (:mod:`supervision.app.schema_gate`)."""
        res = self.shared.resources(self.cfg)
        verdict = await schema_gate(res.db)
        if verdict is None:
            self.gate = PendingGate()
            return build_tree(res, gate=self.gate)
        self.excluded, self.gate = verdict.excluded(), None
        return build_tree(res, excluded=self.excluded)

    async def recheck(self) -> Successor | None:
        """SIGHUP with nothing to apply: the schema checked again; a successor (the same
        configuration) only when the verdict differs from the running tree's."""
        verdict = await schema_gate(self.shared.resources(self.cfg).db)
        if verdict is None:
            if self.gate is None:  # the running tree has its verdict: an outage, no wait
                HEALTH.clear_fault(GATE_FAULT)
            return None
        running: frozenset[str] | None = self.excluded
        if self.gate is not None:  # None while its schema-gate has not passed
            running = self.gate.verdict.excluded() if self.gate.verdict else None
        if verdict.excluded() == running:
            return None
        log.info("schema_verdict_changed", excluded=sorted(verdict.broken))
        return self.gated


async def run_once(cfg: Config, job_name: Job) -> dict[str, Any]:
    """``safetynet run-once --job J``: one cycle under the job's lock; its counts.

    For the outbox relay, cycles repeat until nothing publishable is left."""
    job_name = Job(job_name)  # a caller's plain "outbox-relay" is the same job
    async with open_resources(cfg) as res:
        await check_job(res.db, job_name)
        lock = LockConnection(conninfo(cfg.postgres, "safetynet-lock"),
                              client_deadline(cfg.postgres))
        try:
            outcome: CycleOutcome[Any]
            if job_name is Job.OUTBOX_RELAY:
                outcome = await run_relay_until_drained(relay_job(res), relay_locked_job(res),
                                                        lock)
            else:
                jobs = {job.name: job for job in locked_jobs(res, include_disabled=True)}
                outcome = await run_locked_cycle(jobs[job_name], lock)
        finally:
            lock.discard()
    return _counts(outcome)


def _counts(outcome: CycleOutcome[Any]) -> dict[str, Any]:
    if outcome.status == CycleStatus.RAN and outcome.result is not None:
        counts: dict[str, Any] = outcome.result.as_json()
        return counts
    if outcome.status == CycleStatus.SKIPPED_LOCKED:
        return {"lock": "held_elsewhere"}
    why = f" ({outcome.error})" if outcome.error else ""
    raise InfrastructureError(f"cycle did not complete: {outcome.status}{why}")
