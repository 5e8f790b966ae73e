"""What ``safetynet migrate`` would run now, as data: :func:`plan` reads the database's state
(the ledger, the messenger's indexes, the NOTIFY trigger, the recorded grantees) and
returns a :class:`Plan` — every statement, in order, grouped in :class:`Step` s (a ledger
migration is one transaction; a messenger-side statement runs on its own, outside any
transaction). :mod:`supervision.db.migrate_apply` runs the plan; ``--print-sql`` renders the
very same plan as a psql script (:meth:`Plan.script`). Nothing here writes.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from importlib import resources
from importlib.abc import Traversable
from pathlib import Path
from typing import Any, Literal, LiteralString

import attrs
import psycopg
import psycopg.rows
from psycopg import sql

from supervision.db import grants
from supervision.db import schema_contract as contract
from supervision.db.queries import QUERIES
from supervision.errors import MigrationError

_FILE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
_PARAM = re.compile(r"%\(([a-z_]+)\)s")
LOCK_TIMEOUT = 0.5  # seconds: the longest a migrate statement may queue for a lock
LEDGER_STATEMENT_TIMEOUT = 60  # seconds: a ledger migration touches safetynet's own tables
DDL_STATEMENT_TIMEOUT = 10  # seconds: a trigger's DDL, instant once its lock is granted
# The checksums of the migration files issue 28 emptied, as earlier releases applied
# them: a ledger holding one of these is up to date for that version.
LEGACY_CHECKSUMS: dict[int, frozenset[str]] = {
    1: frozenset({"31e86aaa861c43ffce13ffa9d7a4edf8d2501045c08b7ed7a33691b2d95fe459"}),
    2: frozenset({"63d342dcc754b7c2c3e7dd7ae8040dfeacfd45c38d9556cdb3f56e06e1afd29a"}),
    8: frozenset({"c878a448c5e68c39c506795a18817de205d17d2d2fb8e7d76ad991119443a77c"}),
    9: frozenset({"ce9a662509453c50f54ab7fb23ef4ab86317818b0c608148e332773aeaae20dc"}),
    10: frozenset({"ae1345f12c8d0965c86cb9afb75f8d7fdd3c0481995f0f764c30bdbb1777c116"}),
}
CREATED_OBJECTS = 17  # the migration of safetynet.created_objects
TRIGGER = "trg_integration_outbox_notify"
CREATE_TRIGGER = (f"CREATE TRIGGER {TRIGGER} AFTER INSERT ON messenger.integration_outbox "
                  "FOR EACH STATEMENT EXECUTE FUNCTION safetynet.notify_outbox()")
DROP_TRIGGER = f"DROP TRIGGER IF EXISTS {TRIGGER} ON messenger.integration_outbox"


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
class Statement:
    """One statement of the plan: packaged SQL (a named query, a migration file, the
    contract's DDL) or a composed one (grants: role names as identifiers), with its
    parameters. Applied, the parameters are bound; printed, they are inlined literals."""

    query: str | sql.Composable
    params: Mapping[str, Any] | None = None

    def render(self) -> str:
        if isinstance(self.query, sql.Composable):
            text = self.query.as_string(None)
        elif self.params:
            params = self.params
            text = _PARAM.sub(lambda m: sql.Literal(params[m[1]]).as_string(None), self.query)
        else:
            text = self.query
        text = text.strip()
        return text if text.endswith(";") else text + ";"


def _setting(name: Literal["lock_timeout", "statement_timeout"], value: str,
             local: bool) -> Statement:
    """``SET [LOCAL] name = 'value'``: the same text applied and printed."""
    form = "SET LOCAL {} = {}" if local else "SET {} = {}"
    return Statement(sql.SQL(form).format(sql.SQL(name), sql.Literal(value)))


@attrs.frozen
class Step:
    """One unit migrate runs: a ledger migration or the grants (one transaction each), or
    one messenger-side statement with its session settings (autocommit, e.g. ``CREATE
    INDEX CONCURRENTLY``). :attr:`statements` is everything it runs, in order."""

    label: str
    statements: tuple[Statement, ...]
    transaction: bool
    migration: Migration | None = None
    concurrent: bool = False  # an index build: no statement_timeout
    builds: str | None = None  # the index a CREATE INDEX CONCURRENTLY step builds

    def script(self) -> str:
        """The step as psql runs it (``--print-sql``)."""
        body = "\n".join(s.render() for s in self.statements)
        if self.transaction:
            body = f"BEGIN;\n{body}\nCOMMIT;"
        return f"-- {self.label}\n{body}\n"


def _ms(seconds: float) -> str:
    return f"{max(1, round(seconds * 1000))}ms"


def ledger_step(m: Migration, lock_timeout: float, *, schema: bool = True,
                ledger: bool = True) -> Step:
    """A ledger migration: its file and its ledger row in one transaction, under the
    transaction-scoped advisory lock, with only pg_catalog on the search_path; first the
    safetynet schema (*schema*) and the ledger (*ledger*) when they are missing."""
    create = ((Statement(QUERIES["schema_migrations_create_schema"]),) if schema else ()) + (
        (Statement(QUERIES["schema_migrations_create"]),) if ledger else ())
    return Step(m.label, (
        Statement(QUERIES["schema_migrations_lock"]),
        Statement(QUERIES["schema_migrations_pin_search_path"]),
        _setting("lock_timeout", _ms(lock_timeout), True),
        _setting("statement_timeout", f"{LEDGER_STATEMENT_TIMEOUT}s", True),
        *create,
        Statement(m.sql),
        Statement(QUERIES["schema_migrations_insert"],
                  {"version": m.version, "name": m.name, "checksum": m.checksum}),
    ), transaction=True, migration=m)


def ddl_step(label: str, ddl: str, lock_timeout: float, *, concurrent: bool = False,
             builds: str | None = None) -> Step:
    """A messenger-side statement on its own: a short lock_timeout, statement_timeout
    lifted for an index build (10 s otherwise), then the session's own again."""
    return Step(label, (
        _setting("lock_timeout", _ms(lock_timeout), False),
        _setting("statement_timeout", "0" if concurrent else f"{DDL_STATEMENT_TIMEOUT}s",
                 False),
        Statement(ddl),
        Statement(QUERIES["schema_migrations_reset_statement_timeout"]),
    ), transaction=False, concurrent=concurrent, builds=builds)


def transaction_step(label: str, statements: tuple[Statement, ...],
                     lock_timeout: float) -> Step:
    """Statements in one transaction, with only pg_catalog on the search_path and a short
    ``lock_timeout`` (the grants, the backfilled record, uninstall's trigger and schema)."""
    head = (Statement(QUERIES["schema_migrations_pin_search_path"]),
            _setting("lock_timeout", _ms(lock_timeout), True))
    return Step(label, head + statements, transaction=True)


@attrs.frozen
class Options:
    safetynet_only: bool = False  # only the ledger: no messenger-side object
    notify_trigger: bool = True  # False ([jobs.outbox_relay] wakeup = "poll"): drop it
    lock_timeout: float = LOCK_TIMEOUT
    grant_to: str | None = None  # record this role as a runtime grantee
    grant_read_to: str | None = None  # record this role as a read-only grantee
    folder: Path | None = None  # the migrations (tests); None: the packaged ones


DEFAULTS = Options()


@attrs.frozen
class Plan:
    """Everything migrate would run now, in order; the session lock around it."""

    steps: list[Step]
    verb: str = "migrate"  # or "uninstall": the script's first line names it

    def script(self) -> str:
        """The plan as the psql script a DBA runs (``psql -v ON_ERROR_STOP=1 -f``): the
        session's search_path pin and migrate's advisory lock, each step, the unlock."""
        if not self.steps:
            return ""
        head = (f"-- safetynet {self.verb}: the plan for this database's current state; apply "
                "with\n-- psql -v ON_ERROR_STOP=1 -f FILE (a failure rolls back its step; "
                "print the plan again)\n"
                + Statement(QUERIES["schema_migrations_pin_session_search_path"]).render()
                + "\n" + Statement(QUERIES["schema_migrations_session_lock"]).render()
                + "\n\n")
        tail = Statement(QUERIES["schema_migrations_session_unlock"]).render() + "\n"
        return head + "\n".join(step.script() for step in self.steps) + "\n" + tail


def migrations(folder: Path | None = None) -> list[Migration]:
    """Every migration shipped with the package (or in *folder*), in version order."""
    place: Traversable = (folder if folder is not None
                          else resources.files("supervision.db") / "sql" / "migrations")
    found = []
    for entry in place.iterdir():
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


def ledger(conn: psycopg.Connection[Any]) -> dict[int, tuple[str, str]]:
    """version -> (name, checksum) of what the database has applied ({} before any)."""
    exists = conn.execute(QUERIES["schema_migrations_ledger_exists"]).fetchone()
    if exists is None or exists[0] is None:
        return {}
    rows = conn.execute(QUERIES["schema_migrations_list"]).fetchall()
    return {int(r[0]): (str(r[1]), str(r[2])) for r in rows}


def messenger_catalog(conn: psycopg.Connection[Any]) -> tuple[
        list[contract.CatalogColumn], list[contract.CatalogIndex]]:
    with conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        columns = contract.catalog_columns(cur.execute(
            QUERIES["schema_contract_columns"]).fetchall())
        indexes = contract.catalog_indexes(cur.execute(
            QUERIES["schema_contract_indexes"]).fetchall())
    return columns, indexes


def _ledger_steps(conn: psycopg.Connection[Any], options: Options) -> list[Step]:
    steps: list[Step] = []
    done = ledger(conn)
    # created by the first step only when missing: an upgrade needs no CREATE on the
    # database (docs/operations.md)
    schema = conn.execute(QUERIES["schema_migrations_schema_exists"]).fetchone() is None
    table = conn.execute(QUERIES["schema_migrations_ledger_exists"]).fetchone()
    missing = table is None or table[0] is None
    for migration in migrations(options.folder):
        if migration.version in done:
            if not migration.accepts(done[migration.version][1]):
                raise MigrationError(
                    f"migration {migration.label} changed after it was applied; add a new "
                    "migration instead")
            continue
        first = not steps
        steps.append(ledger_step(migration, options.lock_timeout, schema=first and schema,
                                 ledger=first and missing))
    return steps


def _index_steps(conn: psycopg.Connection[Any], options: Options,
                 recording: bool) -> list[Step]:
    steps = []
    _, indexes = messenger_catalog(conn)
    for index in contract.INDEXES:
        if index.required:
            continue  # the messenger's own keys: check-schema reports them, never built here
        same = contract.equivalent(indexes, index)
        if any(i.valid for i in same):
            continue  # served by an index that exists, whatever its name
        for leftover in same:
            if leftover.name == index.name:  # INVALID: a cancelled build of ours
                steps.append(ddl_step(
                    f"rebuild INVALID {index.name}",
                    f"DROP INDEX CONCURRENTLY IF EXISTS messenger.{index.name}",
                    options.lock_timeout, concurrent=True))
        if any(i.name == index.name and i not in same for i in indexes):
            raise MigrationError(
                f"messenger.{index.name} exists with another definition; rename it, or "
                "build the index check-schema prints under another name")
        step = ddl_step(f"index {index.name}", index.ddl(concurrently=True),
                        options.lock_timeout, concurrent=True, builds=index.name)
        if recording:  # in the same run as the build: uninstall removes exactly these
            step = attrs.evolve(step, statements=(*step.statements, _record(
                "index", index.name, index.table, "built")))
        steps.append(step)
    return steps


def _trigger_steps(conn: psycopg.Connection[Any], options: Options,
                   recording: bool) -> list[Step]:
    trigger = conn.execute(QUERIES["schema_contract_outbox_trigger"]).fetchone()
    present = bool(trigger and trigger[0])
    if options.notify_trigger and not present:
        step = ddl_step(f"trigger {TRIGGER}", CREATE_TRIGGER, options.lock_timeout)
        record = _record("trigger", TRIGGER, "integration_outbox", "built")
    elif not options.notify_trigger and present:
        step = ddl_step(f"drop trigger {TRIGGER} (wakeup = poll)", DROP_TRIGGER,
                        options.lock_timeout)
        record = Statement(QUERIES["created_objects_forget"],
                           {"kind": "trigger", "name": TRIGGER})
    else:
        return []
    return [attrs.evolve(step, statements=(*step.statements, record)) if recording
            else step]


def _record(kind: str, name: str, table: str, how: str) -> Statement:
    return Statement(QUERIES["created_objects_record"],
                     {"kind": kind, "name": name, "table": table, "how": how})


def _recording(conn: psycopg.Connection[Any], options: Options) -> bool:
    """Whether safetynet.created_objects exists, or will by the time the messenger-side
    steps run (its migration is in this build's files)."""
    exists = conn.execute(QUERIES["created_objects_exists"]).fetchone()
    return (exists is not None and exists[0] is not None) or any(
        m.version == CREATED_OBJECTS for m in migrations(options.folder))


def _backfill_steps(conn: psycopg.Connection[Any], options: Options,
                    pending: list[Step]) -> list[Step]:
    """Once, in the migrate that applies migration 0017: the objects earlier releases built
    that are provably safetynet's (see that migration), recorded as 'backfilled'."""
    if options.safetynet_only or not any(
            s.migration and s.migration.version == CREATED_OBJECTS for s in pending):
        return []
    newer = {str(r[0]) for r in conn.execute(
        QUERIES["created_objects_newer_indexes"]).fetchall()}
    _, indexes = messenger_catalog(conn)
    found = [_record("index", index.name, index.table, "backfilled")
             for index in contract.INDEXES
             if not index.required and index.name in newer
             and any(i.name == index.name and i.valid
                     for i in contract.equivalent(indexes, index))]
    if conn.execute(QUERIES["created_objects_trigger_is_ours"]).fetchone() is not None:
        found.append(_record("trigger", TRIGGER, "integration_outbox", "backfilled"))
    if not found:
        return []
    return [transaction_step("record what earlier releases built", tuple(found),
                             options.lock_timeout)]


def _grant_steps(conn: psycopg.Connection[Any], options: Options,
                 migrating: bool) -> list[Step]:
    """The grants of every recorded grantee and of the ones given now: re-applied by every
    migrate that runs a migration (it may add tables or functions) or whose build grants
    otherwise (the digest differs), so the roles keep working (docs/operations.md)."""
    known = {role: (access, digest) for role, access, digest in grants.recorded(conn)}
    given: dict[str, grants.Access] = dict.fromkeys(grants.adopted(conn), "runtime")
    for role, access in ((options.grant_to, "runtime"), (options.grant_read_to, "read")):
        if role is not None:
            grants.require_role(conn, role)
            given[role] = "runtime" if access == "runtime" else "read"
    statements: list[Statement] = []
    for role in sorted(set(known) | set(given)):
        access = given.get(role) or known[role][0]
        record, *composed = grants.statements(conn, role, access)
        assert isinstance(record, tuple)
        if not migrating and role not in given and known[role][1] == record[1]["digest"]:
            continue  # granted by this build already, and no migration ran
        statements.append(Statement(*record))
        statements += [Statement(q) for q in composed if not isinstance(q, tuple)]
    if not statements:
        return []
    roles = ", ".join(sorted(set(known) | set(given)))
    return [transaction_step(f"grants to {roles}", tuple(statements), options.lock_timeout)]


def plan(conn: psycopg.Connection[Any], options: Options = DEFAULTS) -> Plan:
    """What migrate would run now, in order."""
    steps = _ledger_steps(conn, options)
    migrating = bool(steps)
    steps += _backfill_steps(conn, options, steps)  # before anything new is built
    if not options.safetynet_only:
        recording = _recording(conn, options)
        steps += (_index_steps(conn, options, recording)
                  + _trigger_steps(conn, options, recording))
    steps += _grant_steps(conn, options, migrating)
    return Plan(steps)
