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

Every statement runs with a short ``lock_timeout`` (:data:`LOCK_TIMEOUT`) and is retried
with back-off when it cannot get its lock in time, so migrate never queues a lock in
front of the messenger's writers for longer than that. The session is the daemon's
(:func:`supervision.db.pgconn.conninfo`) with ``application_name=safetynet-migrate``;
``statement_timeout`` is lifted only around the concurrent index builds.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from importlib import resources
from typing import Any, LiteralString

import attrs
import psycopg
import psycopg.sql
import stamina

from supervision.db import schema_contract as contract
from supervision.db.pgconn import with_defaults
from supervision.db.queries import QUERIES
from supervision.errors import MigrationError

_FILE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
APPLICATION_NAME = "safetynet-migrate"
LOCK_TIMEOUT = 0.5  # seconds: the longest a migrate statement may queue for a lock
LEDGER_STATEMENT_TIMEOUT = 60  # seconds: a ledger migration touches safetynet's own tables
DDL_STATEMENT_TIMEOUT = 10  # seconds: a trigger's DDL, instant once its lock is granted
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
# The checksums of the migration files issue 28 emptied, as earlier releases applied
# them: a ledger holding one of these is up to date for that version.
LEGACY_CHECKSUMS: dict[int, frozenset[str]] = {
    1: frozenset({"31e86aaa861c43ffce13ffa9d7a4edf8d2501045c08b7ed7a33691b2d95fe459"}),
    2: frozenset({"63d342dcc754b7c2c3e7dd7ae8040dfeacfd45c38d9556cdb3f56e06e1afd29a"}),
    8: frozenset({"c878a448c5e68c39c506795a18817de205d17d2d2fb8e7d76ad991119443a77c"}),
    9: frozenset({"ce9a662509453c50f54ab7fb23ef4ab86317818b0c608148e332773aeaae20dc"}),
    10: frozenset({"ae1345f12c8d0965c86cb9afb75f8d7fdd3c0481995f0f764c30bdbb1777c116"}),
}
TRIGGER = "trg_integration_outbox_notify"
_CREATE_TRIGGER = (f"CREATE TRIGGER {TRIGGER} AFTER INSERT ON messenger.integration_outbox "
                   "FOR EACH STATEMENT EXECUTE FUNCTION safetynet.notify_outbox()")
_DROP_TRIGGER = f"DROP TRIGGER IF EXISTS {TRIGGER} ON messenger.integration_outbox"


@attrs.frozen
class Migration:
    version: int
    name: str
    sql: LiteralString  # packaged files, never user input

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()

    @property
    def label(self) -> str:
        return f"{self.version:04d}_{self.name}"

    def accepts(self, checksum: str) -> bool:
        return checksum == self.checksum or checksum in LEGACY_CHECKSUMS.get(self.version, ())


@attrs.frozen
class Step:
    """One unit migrate runs: a ledger migration (one transaction) or one messenger-side
    statement (autocommit, e.g. ``CREATE INDEX CONCURRENTLY``)."""

    label: str
    sql: str
    migration: Migration | None = None
    concurrent: bool = False  # an index build: no statement_timeout
    builds: str | None = None  # the index a CREATE INDEX CONCURRENTLY step builds

    def script(self, lock_timeout: float) -> str:
        """The step as a DBA would run it by hand (``--print-sql``)."""
        ms = max(1, round(lock_timeout * 1000))
        if self.migration is not None:
            m = self.migration
            return (f"-- {self.label}\nBEGIN;\nSET LOCAL lock_timeout = '{ms}ms';\n"
                    f"SET LOCAL statement_timeout = '{LEDGER_STATEMENT_TIMEOUT}s';\n"
                    f"{m.sql.strip()}\nINSERT INTO safetynet.schema_migrations "
                    f"(version, name, checksum) VALUES ({m.version}, '{m.name}', "
                    f"'{m.checksum}');\nCOMMIT;\n")
        timeout = "0" if self.concurrent else f"{DDL_STATEMENT_TIMEOUT}s"
        return (f"-- {self.label}\nSET lock_timeout = '{ms}ms';\n"
                f"SET statement_timeout = '{timeout}';\n{self.sql};\n")


@attrs.frozen
class Options:
    safetynet_only: bool = False  # only the ledger: no messenger-side object
    notify_trigger: bool = True  # False ([jobs.outbox_relay] wakeup = "poll"): drop it
    lock_timeout: float = LOCK_TIMEOUT


def migrations() -> list[Migration]:
    """Every migration shipped with the package, in version order."""
    folder = resources.files("supervision.db") / "sql" / "migrations"
    found = []
    for entry in folder.iterdir():
        match = _FILE.match(entry.name)
        if match:
            found.append(
                Migration(int(match[1]), match[2], entry.read_text(encoding="utf-8"))
            )
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise MigrationError(f"duplicate migration versions: {versions}")
    return found


def _connect(dsn: str) -> psycopg.Connection[Any]:
    try:
        conn: psycopg.Connection[Any] = psycopg.connect(
            with_defaults(dsn, application_name=APPLICATION_NAME), autocommit=True)
    except psycopg.OperationalError as exc:
        if "unsupported startup parameter" in str(exc):
            raise MigrationError(
                "the server refused the session's startup options: migrate needs a direct "
                "connection or a pooler in session mode (a transaction-mode pooler is in "
                "the way)") from exc
        raise
    return conn


def ledger(conn: psycopg.Connection[Any]) -> dict[int, tuple[str, str]]:
    """version -> (name, checksum) of what the database has applied ({} before any)."""
    exists = conn.execute(QUERIES["schema_migrations_ledger_exists"]).fetchone()
    if exists is None or exists[0] is None:
        return {}
    rows = conn.execute(QUERIES["schema_migrations_list"]).fetchall()
    return {int(r[0]): (str(r[1]), str(r[2])) for r in rows}


@attrs.frozen
class Versions:
    """The database's ledger against this build's migrations."""

    pending: list[Migration]
    ahead: list[str]  # applied versions this build does not know (a newer release's)

    @property
    def pending_labels(self) -> list[str]:
        return [m.label for m in self.pending]


def versions(conn: psycopg.Connection[Any]) -> Versions:
    done = ledger(conn)
    known = migrations()
    pending = [m for m in known if m.version not in done]
    names = {m.version for m in known}
    ahead = [f"{v:04d}_{done[v][0]}" for v in sorted(done) if v not in names]
    return Versions(pending, ahead)


def messenger_catalog(conn: psycopg.Connection[Any]) -> tuple[
        list[contract.CatalogColumn], list[contract.CatalogIndex]]:
    with conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        columns = contract.catalog_columns(cur.execute(
            QUERIES["schema_contract_columns"]).fetchall())
        indexes = contract.catalog_indexes(cur.execute(
            QUERIES["schema_contract_indexes"]).fetchall())
    return columns, indexes


def check_schema(conn: psycopg.Connection[Any]) -> list[contract.Problem]:
    """The live messenger tables against the contract (``safetynet check-schema``)."""
    return contract.check(*messenger_catalog(conn))


def plan(conn: psycopg.Connection[Any], options: Options = Options()) -> list[Step]:
    """What migrate would run now, in order."""
    steps: list[Step] = []
    done = ledger(conn)
    for migration in migrations():
        if migration.version in done:
            if not migration.accepts(done[migration.version][1]):
                raise MigrationError(
                    f"migration {migration.label} changed after it was applied; add a new "
                    "migration instead")
            continue
        steps.append(Step(migration.label, migration.sql, migration))
    if options.safetynet_only:
        return steps
    _, indexes = messenger_catalog(conn)
    for index in contract.INDEXES:
        if index.required:
            continue  # the messenger's own keys: check-schema reports them, never built here
        same = contract.equivalent(indexes, index)
        if any(i.valid for i in same):
            continue  # served by an index that exists, whatever its name
        for leftover in same:
            if leftover.name == index.name:  # INVALID: a cancelled build of ours
                steps.append(Step(f"rebuild INVALID {index.name}",
                                  f"DROP INDEX CONCURRENTLY IF EXISTS messenger.{index.name}",
                                  concurrent=True))
        if any(i.name == index.name and i not in same for i in indexes):
            raise MigrationError(
                f"messenger.{index.name} exists with another definition; rename it, or "
                "build the index check-schema prints under another name")
        steps.append(Step(f"index {index.name}", index.ddl(concurrently=True),
                          concurrent=True, builds=index.name))
    trigger = conn.execute(QUERIES["schema_contract_outbox_trigger"]).fetchone()
    present = bool(trigger and trigger[0])
    if options.notify_trigger and not present:
        steps.append(Step(f"trigger {TRIGGER}", _CREATE_TRIGGER))
    elif not options.notify_trigger and present:
        steps.append(Step(f"drop trigger {TRIGGER} (wakeup = poll)", _DROP_TRIGGER))
    return steps


def _missing_tables(conn: psycopg.Connection[Any]) -> list[str]:
    present = {str(r[0]) for r in conn.execute(
        QUERIES["schema_contract_messenger_tables"]).fetchall()}
    return [t for t in contract.TABLES if t not in present]


def _retrying(lock_timeout: float) -> Iterator[Any]:
    """Attempts of one statement: a lock not granted within *lock_timeout* (the messenger
    was busy with the table) is tried again after a growing pause, for up to 5 minutes."""
    return iter(stamina.retry_context(
        on=psycopg.errors.LockNotAvailable, attempts=None, timeout=300.0,
        wait_initial=lock_timeout, wait_max=15.0, wait_jitter=lock_timeout))


def _set(conn: psycopg.Connection[Any], name: str, value: str, local: bool = False) -> None:
    conn.execute(QUERIES["schema_migrations_session_setting"],
                 {"name": name, "value": value, "is_local": local})


def _drop_invalid_leftover(conn: psycopg.Connection[Any], name: str) -> None:
    """A concurrent build that failed (its lock_timeout ran out while it waited for the
    messenger's transactions) leaves an INVALID index that ``IF NOT EXISTS`` would take as
    done: drop it, concurrently, before the next try."""
    row = conn.execute(QUERIES["schema_contract_index_invalid"], {"name": name}).fetchone()
    if row is not None:
        conn.execute(psycopg.sql.SQL("DROP INDEX CONCURRENTLY IF EXISTS messenger.{}").format(
            psycopg.sql.Identifier(name)))


def _run(conn: psycopg.Connection[Any], step: Step, options: Options) -> None:
    ms = max(1, round(options.lock_timeout * 1000))
    for attempt in _retrying(options.lock_timeout):
        with attempt:
            if step.migration is not None:
                m = step.migration
                with conn.transaction():
                    conn.execute(QUERIES["schema_migrations_lock"])
                    conn.execute(QUERIES["schema_migrations_pin_search_path"])
                    _set(conn, "lock_timeout", f"{ms}ms", local=True)
                    _set(conn, "statement_timeout", f"{LEDGER_STATEMENT_TIMEOUT}s", local=True)
                    conn.execute(QUERIES["schema_migrations_create"])
                    done = ledger(conn)
                    if m.version in done:  # another migrate applied it meanwhile
                        return
                    conn.execute(m.sql)
                    conn.execute(QUERIES["schema_migrations_insert"],
                                 {"version": m.version, "name": m.name,
                                  "checksum": m.checksum})
                return
            _set(conn, "lock_timeout", f"{ms}ms")
            if step.builds is not None:
                _drop_invalid_leftover(conn, step.builds)
            before = conn.execute("SHOW statement_timeout").fetchone()
            _set(conn, "statement_timeout",
                 "0" if step.concurrent else f"{DDL_STATEMENT_TIMEOUT}s")
            try:
                # packaged statements (schema_contract, this module), never user input
                conn.execute(step.sql)
            finally:
                _set(conn, "statement_timeout", str(before[0]) if before else "0")
            return


def migrate(dsn: str, options: Options = Options()) -> list[Step]:
    """Apply what :func:`plan` finds to the database at *dsn*; return the steps run."""
    try:
        with _connect(dsn) as conn:
            missing = _missing_tables(conn)
            if missing:
                raise MigrationError(
                    "messenger tables missing: " + ", ".join(f"messenger.{t}" for t in missing)
                    + "; safetynet installs beside the messenger's schema and never creates "
                    "it (a demo or test database: `safetynet migrate --messenger-fixture`)")
            conn.execute(QUERIES["schema_migrations_session_lock"])
            try:
                applied = []
                for step in plan(conn, options):
                    _run(conn, step, options)
                    applied.append(step)
            finally:
                conn.execute(QUERIES["schema_migrations_session_unlock"])
    except psycopg.Error as exc:
        raise MigrationError(f"migration failed: {type(exc).__name__}: {exc}") from exc
    return applied


def print_sql(dsn: str, options: Options = Options()) -> str:
    """The script of what :func:`migrate` would run now (nothing runs)."""
    try:
        with _connect(dsn) as conn:
            steps = plan(conn, options)
    except psycopg.Error as exc:
        raise MigrationError(f"migration failed: {type(exc).__name__}: {exc}") from exc
    return "\n".join(step.script(options.lock_timeout) for step in steps)


def apply_messenger_fixture(dsn: str) -> None:
    """Create the messenger's tables from ``supervision/dev/messenger_fixture.sql`` — for
    the demo, the tests and the benches only. Refuses when any messenger table exists."""
    sql = (resources.files("supervision") / "dev" / "messenger_fixture.sql").read_text(
        encoding="utf-8")
    try:
        with _connect(dsn) as conn:
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


def install_demo(dsn: str, options: Options = Options()) -> list[Step]:
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
        return bool(self.versions.pending) or any(p.blocking for p in self.problems)

    def lines(self) -> list[str]:
        out = [p.line() for p in self.problems]
        if self.versions.pending:
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
        with _connect(dsn) as conn:
            return SchemaReport(check_schema(conn), versions(conn))
    except psycopg.Error as exc:
        raise MigrationError(f"schema check failed: {type(exc).__name__}: {exc}") from exc


def grant_statements(conn: psycopg.Connection[Any], role: str) -> list[psycopg.sql.Composed]:
    """What the runtime role needs, from :data:`supervision.db.schema_contract.TABLE_PRIVILEGES`
    (the messenger side) and the safetynet schema's own tables and functions; no CREATE
    anywhere, no TRUNCATE, no privilege on a messenger table the contract does not list."""
    from psycopg import sql

    who = sql.Identifier(role)
    out = [sql.SQL("GRANT USAGE ON SCHEMA messenger, safetynet TO {}").format(who)]
    for table, privileges in contract.TABLE_PRIVILEGES.items():
        out.append(sql.SQL("GRANT {} ON messenger.{} TO {}").format(
            sql.SQL(", ").join(sql.SQL(p) for p in privileges), sql.Identifier(table), who))
    for table in contract.SEQUENCE_TABLES:
        row = conn.execute(QUERIES["schema_migrations_serial_sequence"],
                           {"table": f"messenger.{table}"}).fetchone()
        if row and row[0]:  # a serial's sequence (an identity column needs no grant)
            out.append(sql.SQL("GRANT USAGE ON SEQUENCE {} TO {}").format(
                sql.SQL(row[0]), who))
    out += [
        sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA safetynet "
                "TO {}").format(who),
        sql.SQL("REVOKE INSERT, UPDATE, DELETE ON safetynet.schema_migrations FROM {}")
        .format(who),
        # the operator trail is append-only (its trigger refuses it too): read and add
        sql.SQL("REVOKE UPDATE, DELETE ON safetynet.operator_actions FROM {}").format(who),
        sql.SQL("GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA safetynet TO {}").format(who),
    ]
    return out


def grant(dsn: str, role: str) -> list[str]:
    """Grant *role* (which must exist) what the runtime needs; the statements run."""
    try:
        with _connect(dsn) as conn:
            exists = conn.execute(QUERIES["schema_migrations_role_exists"],
                                  {"role": role}).fetchone()
            if exists is None:
                raise MigrationError(f"role {role!r} does not exist; create it first "
                                     "(docs/operations.md)")
            statements = grant_statements(conn, role)
            with conn.transaction():
                for statement in statements:
                    conn.execute(statement)
            return [s.as_string(conn) + ";" for s in statements]
    except psycopg.Error as exc:
        raise MigrationError(f"grant failed: {type(exc).__name__}: {exc}") from exc


def every_step() -> list[Step]:
    """Every step migrate can ever run (each migration; each index built, or dropped as an
    INVALID leftover; the trigger installed and dropped): what ``make lint`` hands to
    squawk, in the form --print-sql shows."""
    steps = [Step(m.label, m.sql, m) for m in migrations()]
    for index in contract.INDEXES:
        if not index.required:
            steps.append(Step(f"rebuild INVALID {index.name}",
                              f"DROP INDEX CONCURRENTLY IF EXISTS messenger.{index.name}",
                              concurrent=True))
            steps.append(Step(f"index {index.name}", index.ddl(), concurrent=True,
                              builds=index.name))
    steps += [Step(f"trigger {TRIGGER}", _CREATE_TRIGGER), Step("drop trigger", _DROP_TRIGGER)]
    return steps


def write_lint_input(folder: str) -> None:
    """One file per step of :func:`every_step` under *folder* (``make lint`` runs squawk
    over them)."""
    from pathlib import Path

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    for n, step in enumerate(every_step()):
        name = re.sub(r"[^a-z0-9]+", "_", step.label.lower()).strip("_")
        ignores = LINT_EXCEPTIONS.get(step.migration.version, {}) if step.migration else {}
        header = "".join(f"-- {rule}: {why}\n-- squawk-ignore-file {rule}\n"
                         for rule, why in ignores.items())
        (out / f"{n:03d}_{name}.sql").write_text(header + step.script(LOCK_TIMEOUT),
                                                 encoding="utf-8")


if __name__ == "__main__":
    import sys

    write_lint_input(sys.argv[1])
