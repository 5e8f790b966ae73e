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

A database that does not answer is not a verdict: the tree starts with every job and the
lock keepers back off as they do for any outage.
"""

from __future__ import annotations

import attrs
import psycopg
import structlog

from supervision.db import schema_contract as contract
from supervision.db.database import Database
from supervision.db.migrate import SchemaReport, check_schema, versions
from supervision.db.queries import QUERIES
from supervision.errors import ConfigError, ConfigurationFault, InfrastructureError
from supervision.metrics import SCHEMA_AHEAD, SCHEMA_BROKEN, SCHEMA_MISSING_INDEXES
from supervision.tree.health import HEALTH

log = structlog.get_logger("schema")


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


async def schema_gate(db: Database) -> Verdict:
    """Check the session and the schema; raise ``ConfigError`` on a transaction-mode
    pooler or pending migrations; record the rest."""
    try:
        report, settings = await db.run(_report)
    except (psycopg.Error, InfrastructureError) as exc:
        pooled = pooler_problem(exc)
        if pooled:
            raise ConfigError([pooled]) from exc
        log.warning("schema_check_skipped", reason=f"{type(exc).__name__}: {exc}")
        return Verdict({})
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
    return Verdict(broken)


async def check_job(db: Database, job: str) -> None:
    """``run-once --job J``: exit 78 (a ``ConfigError``) when J's contract is broken."""
    verdict = await schema_gate(db)
    if job in verdict.broken:
        raise ConfigError([f"{job}: messenger schema breaks the contract at "
                           + ", ".join(f"{contract.SCHEMA}.{s}" for s in verdict.broken[job])
                           + " (safetynet check-schema prints the fix); no row touched"])
