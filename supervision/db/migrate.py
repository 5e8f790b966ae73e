"""``safetynet migrate``: the ``safetynet`` schema, plus the few objects safetynet needs on
the messenger's tables, applied online. The messenger's tables themselves are the
messenger's: never created, altered or dropped here (docs/contract.md).

Two kinds of step, planned against the live database and then run (``--print-sql``
prints the same plan, so what it shows is exactly what would run):

* **ledger migrations** — ``sql/migrations/NNNN_name.sql``, applied in order, once, each
  in its own transaction together with its row in ``safetynet.schema_migrations``. A
  transaction-scoped advisory lock serialises concurrent runs. A file that changed after
  it was applied is refused (its checksum no longer matches), except the files issue 28
  emptied (the messenger's tables and indexes moved out of the ledger): their old
  checksums stay recognised (:data:`LEGACY_CHECKSUMS`), so a database migrated by an
  earlier release upgrades with no manual step;
* **messenger-side objects** — the recommended indexes of
  :data:`supervision.db.schema_contract.INDEXES`, each built ``CREATE INDEX CONCURRENTLY``
  outside a transaction unless an equivalent VALID index exists under any name (reused,
  never duplicated); an INVALID leftover under our name (a cancelled build) is dropped
  ``CONCURRENTLY`` and built again; and the relay's NOTIFY trigger, installed, or dropped
  in ``poll`` mode.

and, last, the grants of every role recorded by ``--grant-to`` / ``--grant-read-to``
(:mod:`supervision.db.grants`), re-applied whenever a migration ran or the build grants
otherwise.

Every statement runs with a short ``lock_timeout`` (:data:`LOCK_TIMEOUT`) and is retried
with back-off when it cannot get its lock in time, so migrate never queues a lock in
front of the messenger's writers for longer than that. The session is the daemon's
(:func:`supervision.db.pgconn.conninfo`) with ``application_name=safetynet-migrate``;
``statement_timeout`` is lifted only around the concurrent index builds.

Planning (what would run, from the database's state: the plan as data) is
:mod:`supervision.db.migrate_plan`; running it, :mod:`supervision.db.migrate_apply`;
``--print-sql`` renders the same plan (:meth:`~supervision.db.migrate_plan.Plan.script`).
This module keeps check-schema's report, the messenger fixture and ``make lint``'s input.
"""

from __future__ import annotations

import re
from importlib import resources
from typing import Any

import attrs
import psycopg

from supervision.db import grants
from supervision.db import schema_contract as contract
from supervision.db.migrate_apply import APPLICATION_NAME, connect, migrate, planned, print_sql
from supervision.db.migrate_plan import (
    CREATE_TRIGGER,
    DEFAULTS,
    DROP_TRIGGER,
    LEGACY_CHECKSUMS,
    LOCK_TIMEOUT,
    TRIGGER,
    Migration,
    Options,
    Plan,
    Step,
    ddl_step,
    ledger,
    ledger_step,
    messenger_catalog,
    migrations,
    plan,
)
from supervision.db.queries import QUERIES
from supervision.errors import MigrationError

__all__ = ["APPLICATION_NAME", "LEGACY_CHECKSUMS", "LOCK_TIMEOUT", "Migration", "Options",
           "Plan", "Step", "apply_messenger_fixture", "check_schema", "grant",
           "install_demo", "ledger", "messenger_catalog", "migrate", "migrations", "plan",
           "planned", "print_sql", "schema_report", "versions"]

# squawk findings accepted in migrations already applied by earlier releases (their text
# is fixed by its checksum), each with why: `make lint` writes these above the migration
# as squawk-ignore-file comments (write_lint_input).
LINT_EXCEPTIONS: dict[int, dict[str, str]] = {
    v: {"prefer-text-field": "safetynet's own bookkeeping tables, a few rows each: the "
        "widths bound what an operator or a broker's error may write, and widening one "
        "later locks only that table, which no messenger writer touches",
        **({"prefer-bigint-over-int": "counters and backend pids bounded far below 2^31 "
            "(failures, redrives, holder_pid)"} if v in (3, 5, 6) else {})}
    for v in (2, 3, 5, 6)
}
LINT_EXCEPTIONS[11] = {
    "require-concurrent-index-creation": "the two indexes are on safetynet's own "
    "outbox_dead_letters, which only the relay writes (rarely): a plain build holds back "
    "only dead-lettering for its duration, and a ledger migration runs in one transaction, "
    "where CONCURRENTLY is impossible; messenger-side indexes are built CONCURRENTLY by "
    "migrate (schema_contract.INDEXES)"}

# Every ledger step creates the ledger if it is missing (CREATE TABLE IF NOT EXISTS), as
# the first release created it.
LEDGER_LINT_EXCEPTION = {
    "prefer-bigint-over-int": "safetynet.schema_migrations.version counts migration files "
    "(four digits); the table exists since the first release and is never recreated"}


@attrs.frozen
class Versions:
    """The database's ledger against this build's migrations."""

    pending: list[Migration]
    ahead: list[str]  # applied versions this build does not know (a newer release's)
    installed: bool = True  # False: no ledger row at all (before the first migrate)

    @property
    def pending_labels(self) -> list[str]:
        return [m.label for m in self.pending]


def versions(conn: psycopg.Connection[Any]) -> Versions:
    done = ledger(conn)
    known = migrations()
    pending = [m for m in known if m.version not in done]
    names = {m.version for m in known}
    ahead = [f"{v:04d}_{done[v][0]}" for v in sorted(done) if v not in names]
    return Versions(pending, ahead, installed=bool(done))


def check_schema(conn: psycopg.Connection[Any]) -> list[contract.Problem]:
    """The live messenger tables against the contract (``safetynet check-schema``)."""
    return contract.check(*messenger_catalog(conn))


def apply_messenger_fixture(dsn: str) -> None:
    """Create the messenger's tables from ``supervision/dev/messenger_fixture.sql`` — for
    the demo, the tests and the benches only. Refuses when any messenger table exists."""
    sql = (resources.files("supervision") / "dev" / "messenger_fixture.sql").read_text(
        encoding="utf-8")
    try:
        with connect(dsn) as conn:
            present = {str(r[0]) for r in conn.execute(
                QUERIES["schema_contract_messenger_tables"]).fetchall()}
            if present:
                raise MigrationError(
                    "the messenger fixture is for empty databases; messenger tables exist "
                    "already: " + ", ".join(sorted(present)))
            with conn.transaction():
                conn.execute(sql)  # a packaged file
    except psycopg.Error as exc:
        raise MigrationError(f"messenger fixture failed: {type(exc).__name__}: {exc}") from exc


def install_demo(dsn: str, options: Options = DEFAULTS) -> list[Step]:
    """The messenger fixture, then :func:`migrate`: what the dev stack, the tests and the
    benches set up on an empty database."""
    apply_messenger_fixture(dsn)
    return migrate(dsn, options)


@attrs.frozen
class SchemaReport:
    """``check-schema``: the contract's problems and the ledger's state."""

    problems: list[contract.Problem]
    versions: Versions

    @property
    def blocking(self) -> bool:
        """Before the first migrate only the messenger's contract can block: its pending
        migrations are the install itself."""
        pending = self.versions.installed and bool(self.versions.pending)
        return pending or any(p.blocking for p in self.problems)

    def lines(self) -> list[str]:
        out = [p.line() for p in self.problems]
        if not self.versions.installed:
            out.append("safetynet not installed yet: the messenger's tables are checked "
                       "above; install with safetynet migrate (docs/operations.md)")
        elif self.versions.pending:
            out.append("error: safetynet migrations pending: "
                       + ", ".join(self.versions.pending_labels)
                       + " fix: safetynet migrate (docs/operations.md)")
        if self.versions.ahead:
            out.append("warning: the database is ahead of this build: "
                       + ", ".join(self.versions.ahead)
                       + " (runs: every migration keeps the previous release working)")
        return out


def schema_report(dsn: str) -> SchemaReport:
    try:
        with connect(dsn) as conn:
            return SchemaReport(check_schema(conn), versions(conn))
    except psycopg.Error as exc:
        raise MigrationError(f"schema check failed: {type(exc).__name__}: {exc}") from exc


def grant(dsn: str, role: str, access: grants.Access = "runtime") -> list[str]:
    """Record *role* (which must exist) as a grantee and grant it what it needs (with
    whatever else migrate has to do); the grant statements that ran."""
    options = Options(grant_to=role) if access == "runtime" else Options(grant_read_to=role)
    steps = migrate(dsn, options)
    return [s.render() for step in steps if step.label.startswith("grants to ")
            for s in step.statements]


def every_step() -> list[Step]:
    """Every step migrate can ever run (each migration; each index built, or dropped as an
    INVALID leftover; the trigger installed and dropped): what ``make lint`` hands to
    squawk, in the form --print-sql shows."""
    steps = [ledger_step(m, LOCK_TIMEOUT) for m in migrations()]
    for index in contract.INDEXES:
        if not index.required:
            steps.append(ddl_step(f"rebuild INVALID {index.name}",
                                  f"DROP INDEX CONCURRENTLY IF EXISTS messenger.{index.name}",
                                  LOCK_TIMEOUT, concurrent=True))
            steps.append(ddl_step(f"index {index.name}", index.ddl(), LOCK_TIMEOUT,
                                  concurrent=True, builds=index.name))
    steps += [ddl_step(f"trigger {TRIGGER}", CREATE_TRIGGER, LOCK_TIMEOUT),
              ddl_step("drop trigger", DROP_TRIGGER, LOCK_TIMEOUT)]
    return steps


def write_lint_input(folder: str) -> None:
    """One file per step of :func:`every_step` under *folder* (``make lint`` runs squawk
    over them)."""
    from pathlib import Path

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    for n, step in enumerate(every_step()):
        name = re.sub(r"[^a-z0-9]+", "_", step.label.lower()).strip("_")
        ignores = ({**LEDGER_LINT_EXCEPTION, **LINT_EXCEPTIONS.get(step.migration.version, {})}
                   if step.migration else {})
        header = "".join(f"-- {rule}: {why}\n-- squawk-ignore-file {rule}\n"
                         for rule, why in ignores.items())
        (out / f"{n:03d}_{name}.sql").write_text(header + step.script(),
                                                 encoding="utf-8")


if __name__ == "__main__":
    import sys

    write_lint_input(sys.argv[1])
