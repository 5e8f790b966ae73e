"""The schema check the daemon runs at start and at every tree start (SIGHUP), and
``run-once`` before its cycle: the same as ``safetynet check-schema``
(:mod:`supervision.db.schema_contract`).

* safetynet migrations pending: the daemon refuses to start (a ``ConfigError``, exit 78,
  naming them) — a daemon on a half-migrated schema would crash-loop its actors while
  its probes answer 200;
* the database ahead of this build (a newer release migrated it): a warning and
  ``safetynet_schema_migrations_ahead``; it runs (expand/contract, docs/architecture.md);
* a job whose messenger columns break the contract does not run: a configuration fault
  ``schema:<job>`` naming ``table.column`` (readiness 503) and
  ``safetynet_schema_contract_broken{job}``; the other jobs run. ``run-once`` of such a
  job exits 78 naming the column, before it touches a row;
* a recommended index missing: a warning and ``safetynet_schema_missing_indexes``.

A database that does not answer is not a verdict, and the gate is never skipped: the
tree starts (the exporter answers, ``/readyz`` 503 naming the wait: fault
``schema-gate``) but every job waits (:func:`after_gate`) while the ``schema-gate`` actor
(:func:`serve_schema_gate`) tries the check again, backing off up to
:data:`RETRY_CAP` seconds, until PostgreSQL answers; then the jobs the verdict allows start
and a broken one stays idle with its fault. Pending migrations found then keep the jobs
waiting with the fault naming them (run ``safetynet migrate``; the next try passes). A
SIGHUP builds the next tree after a check of its own.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import attrs
import psycopg
import structlog
import trio

from supervision.db import schema_contract as contract
from supervision.db.database import Database
from supervision.db.migrate import SchemaReport, check_schema, versions
from supervision.db.pgconn import connect
from supervision.db.queries import QUERIES
from supervision.errors import ConfigError, ConfigurationFault, InfrastructureError, describe
from supervision.metrics import SCHEMA_AHEAD, SCHEMA_BROKEN, SCHEMA_MISSING_INDEXES
from supervision.tree.backoff import Backoff
from supervision.tree.health import HEALTH

log = structlog.get_logger("schema")
GATE_FAULT = "schema-gate"  # the readiness fault while the check has not passed
RETRY_CAP = 5.0  # seconds: the longest wait between two tries of a deferred check


@attrs.frozen
class Verdict:
    broken: dict[str, list[str]]  # job -> table.column (or index) that stop it

    def excluded(self) -> frozenset[str]:
        return frozenset(self.broken)


POOLER = ("safetynet needs a direct connection to PostgreSQL or a pooler in session mode "
          "(its advisory locks, LISTEN and session timeouts live in one session); a "
          "transaction-mode pooler is in the way")


def pooler_problem(error: BaseException) -> str | None:
    """The one-line verdict for a connection refused by a transaction-mode pooler
    (PgBouncer: ``unsupported startup parameter: options``), or None."""
    chain: list[BaseException | None] = [error, error.__cause__, error.__context__]
    if any(e is not None and "unsupported startup parameter" in str(e) for e in chain):
        return f"postgres.dsn: the server refused the session's startup options: {POOLER}"
    return None


def _report(conn: psycopg.Connection) -> tuple[SchemaReport, dict[str, str]]:
    row = conn.execute(QUERIES["schema_contract_session_settings"]).fetchone()
    settings = {"statement_timeout": str(row[0]),
                "idle_in_transaction_session_timeout": str(row[1])} if row else {}
    return SchemaReport(check_schema(conn), versions(conn)), settings


def dropped_settings(settings: dict[str, str]) -> list[str]:
    """Session bounds that did not take effect (0: the server's default, not ours)."""
    return [name for name, value in sorted(settings.items()) if value in ("0", "0ms")]


async def schema_gate(db: Database, *, defer: bool = True) -> Verdict | None:
    """Check the session and the schema; raise ``ConfigError`` on a transaction-mode
    pooler or pending migrations; record the rest. None when PostgreSQL did not answer
    (the fault ``schema-gate`` says so until a check passes); without *defer*, an
    ``InfrastructureError`` naming the driver's reason instead."""
    try:
        report, settings = await db.run(_report)
    except (psycopg.Error, InfrastructureError) as exc:
        pooled = pooler_problem(exc)
        if pooled:
            raise ConfigError([pooled]) from exc
        # the pool only says it timed out: a direct connection tells libpq's reason
        reason = await trio.to_thread.run_sync(_connect_reason, db.conninfo) or describe(exc)
        if not defer:
            raise InfrastructureError(f"schema check: PostgreSQL did not answer, no row "
                                      f"touched: {reason}") from exc
        log.warning("schema_check_deferred", reason=reason)
        HEALTH.set_fault(GATE_FAULT, "schema not checked yet, jobs wait: PostgreSQL did "
                         f"not answer ({reason})")
        return None
    dropped = dropped_settings(settings)
    if dropped:
        raise ConfigError([f"postgres.dsn: {', '.join(dropped)} is 0 on the server, not "
                           f"what [postgres] sets: {POOLER}"])
    if report.versions.pending:
        raise ConfigError([
            "safetynet migrations pending: " + ", ".join(report.versions.pending_labels)
            + "; run `safetynet migrate` first (docs/operations.md, rolling upgrade)"])
    SCHEMA_AHEAD.set(len(report.versions.ahead))
    if report.versions.ahead:
        log.warning("schema_ahead_of_build", migrations=report.versions.ahead)
    missing = [p for p in report.problems if not p.blocking]
    SCHEMA_MISSING_INDEXES.set(len(missing))
    for problem in missing:
        log.warning("schema_index_missing", index=problem.subject, fix=problem.fix)
    broken = contract.broken_jobs(report.problems)
    for job in contract.JOBS:
        if job in broken:
            subjects = ", ".join(f"{contract.SCHEMA}.{s}" for s in broken[job])
            reason = f"messenger schema breaks the contract: {subjects}"
            HEALTH.set_fault(f"schema:{job}", reason)
            SCHEMA_BROKEN.labels(job=job).set(1)
            log.error("job_not_started", job=job, fault=ConfigurationFault.__name__,
                      reason=reason,
                      problems=[p.line() for p in report.problems
                                if p.blocking and job in p.jobs])
        else:
            HEALTH.clear_fault(f"schema:{job}")
            SCHEMA_BROKEN.labels(job=job).set(0)
    HEALTH.clear_fault(GATE_FAULT)
    return Verdict(broken)


@attrs.define
class PendingGate:
    """A schema check PostgreSQL did not answer when the tree was built: the tree's jobs
    wait on it (:func:`after_gate`) while :func:`serve_schema_gate` tries again."""

    decided: trio.Event = attrs.field(factory=trio.Event)
    verdict: Verdict | None = None


async def serve_schema_gate(db: Database, gate: PendingGate, *,
                            task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                            ) -> None:
    """The ``schema-gate`` actor: the check again, backing off, until it gives a verdict
    (then the waiting jobs go on, and the actor ends)."""
    task_status.started()
    retry, failures = Backoff(base=0.5, cap=RETRY_CAP), 0
    while True:
        try:
            verdict = await schema_gate(db)
        except ConfigError as exc:  # pending migrations, a pooler: wait for the fix
            reason = "; ".join(exc.problems)
            HEALTH.set_fault(GATE_FAULT, f"jobs wait: {reason}")
            log.error("schema_gate_refused", reason=reason)
            verdict = None
        if verdict is not None:
            gate.verdict = verdict
            gate.decided.set()
            log.info("schema_gate_passed", tries=failures + 1,
                     excluded=sorted(verdict.broken))
            return
        await trio.sleep(retry.delay(failures))
        failures += 1


async def after_gate(gate: PendingGate, job: str, serve: Callable[[], Awaitable[None]], *,
                     task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Run *serve* (a job's actor) once *gate* has passed, unless the verdict excludes
    *job* (then idle: its fault is on ``/readyz``; a SIGHUP checks again)."""
    task_status.started()
    await gate.decided.wait()
    assert gate.verdict is not None
    if job in gate.verdict.broken:
        await trio.sleep_forever()
    await serve()


async def check_job(db: Database, job: str) -> None:
    """``run-once --job J``: exit 78 (a ``ConfigError``) when J's contract is broken; an
    ``InfrastructureError`` naming libpq's reason when PostgreSQL does not answer."""
    verdict = await schema_gate(db, defer=False)
    assert verdict is not None
    if job in verdict.broken:
        raise ConfigError([f"{job}: messenger schema breaks the contract at "
                           + ", ".join(f"{contract.SCHEMA}.{s}" for s in verdict.broken[job])
                           + " (safetynet check-schema prints the fix); no row touched"])


def _connect_reason(dsn: str) -> str | None:
    """Why a connection to *dsn* fails (libpq's first line), or None when it does not."""
    try:
        connect(dsn, None).close()
    except psycopg.Error as exc:
        return describe(exc)
    return None
