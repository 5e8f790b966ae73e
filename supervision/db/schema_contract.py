"""The messenger schema as safetynet relies on it: one place, read by ``check-schema``, by
the daemon's start-up check, by ``migrate`` (the indexes it builds) and by
``migrate --grant-to`` (the privileges the runtime needs). docs/contract.md says the
same in words.

The messenger owns its tables: safetynet never creates, alters or drops them. What it
needs of them is written here, per job:

* :data:`COLUMNS` — every column a job reads or writes, with its type family, the width a
  written text column needs for the longest value safetynet writes, and whether
  safetynet's INSERTs fill it;
* :data:`INDEXES` — the indexes the queries are written around, recognised by
  definition (table, key columns, uniqueness, predicate) under any name. ``required``
  ones (the unique keys that ``ON CONFLICT`` names) stop the jobs that need them; the
  others are recommended (a missing one is a warning and a gauge) and are built by
  ``migrate`` (``CONCURRENTLY``, under the name given here) when no equivalent exists.

What the runtime role is granted, per column, is derived from :data:`COLUMNS` by
:data:`supervision.db.grants.COLUMN_PRIVILEGES`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any, Literal

import attrs

from supervision.jobs import Job

SCHEMA = "messenger"
FINALIZE, REAPER, RELAY = Job.RECORDING_FINALIZE, Job.CONFERENCE_REAPER, Job.OUTBOX_RELAY
JOBS = tuple(Job)

Family = Literal["uuid", "text", "integer", "bigint", "timestamptz", "jsonb"]
Access = Literal["read", "write", "insert"]

# pg_type.typname -> family; a column of a family outside its expected one is a mismatch
_FAMILY_OF_TYPE: dict[str, str] = {
    "uuid": "uuid", "text": "text", "varchar": "text", "bpchar": "text",
    "int2": "smallint", "int4": "integer", "int8": "bigint", "timestamptz": "timestamptz",
    "jsonb": "jsonb",
}
# which catalog families satisfy an expected one (a bigint column holds any integer)
_ACCEPTS: dict[Family, frozenset[str]] = {
    "integer": frozenset({"integer", "bigint"}), "bigint": frozenset({"bigint"}),
}
_DDL_TYPE: dict[Family, str] = {
    "uuid": "uuid", "text": "text", "integer": "integer", "bigint": "bigint",
    "timestamptz": "timestamptz", "jsonb": "jsonb",
}


@attrs.frozen
class Column:
    table: str
    name: str
    family: Family
    jobs: frozenset[str]
    access: Access = "read"
    # a written text column must hold this many characters (the longest value written)
    width: int | None = None

    @property
    def qualified(self) -> str:
        return f"{self.table}.{self.name}"


@attrs.frozen
class Index:
    name: str  # the name migrate gives it; an equivalent one under any name serves
    table: str
    columns: tuple[str, ...]
    jobs: frozenset[str]
    predicate: str | None = None  # as PostgreSQL would print it, modulo casts
    unique: bool = False
    required: bool = False  # False: recommended, and built by migrate
    why: str = ""

    def ddl(self, concurrently: bool = True) -> str:
        unique = "UNIQUE " if self.unique else ""
        how = "CONCURRENTLY IF NOT EXISTS " if concurrently else ""
        where = f" WHERE {self.predicate}" if self.predicate else ""
        return (f"CREATE {unique}INDEX {how}{self.name} ON {SCHEMA}.{self.table} "
                f"({', '.join(self.columns)}){where}")


def _cols(table: str, jobs: Iterable[str], access: Access,
          spec: Mapping[str, Family | tuple[Family, int]]) -> list[Column]:
    out = []
    for name, kind in spec.items():
        family, width = kind if isinstance(kind, tuple) else (kind, None)
        out.append(Column(table, name, family, frozenset(jobs), access, width))
    return out


_BOTH = (FINALIZE, REAPER)
# The outbox columns the finalizer and the reaper INSERT (and the relay reads).
_OUTBOX_INSERT: dict[str, Family | tuple[Family, int]] = {
    "topic": ("text", 255), "message_key": ("text", 64), "dedupe_key": ("text", 64),
    "event_type": ("text", 32), "payload": "jsonb", "headers": "jsonb"}
_REALTIME_INSERT: dict[str, Family | tuple[Family, int]] = {
    "kind": ("text", 18), "target_kind": ("text", 9), "chat_id": "uuid",
    "session_kind": ("text", 10), "reference_id": "uuid", "payload": "jsonb"}

COLUMNS: tuple[Column, ...] = tuple([
    # recording-finalize: its work queue
    *_cols("recording_finalize_attempts", [FINALIZE], "read", {
        "id": "uuid", "recording_id": "uuid", "session_kind": "text", "session_id": "uuid",
        "created_at": "timestamptz"}),
    *_cols("recording_finalize_attempts", [FINALIZE], "write", {
        "status": ("text", 11), "attempts": "integer", "next_attempt_at": "timestamptz",
        "last_error": ("text", 512), "updated_at": "timestamptz"}),
    # recordings: the finalizer writes their outcome; the reaper reads a conference's
    *_cols("call_recordings", _BOTH, "read", {
        "id": "uuid", "session_kind": "text", "session_id": "uuid",
        "created_at": "timestamptz"}),
    *_cols("call_recordings", [FINALIZE], "read", {
        "chat_id": "uuid", "deal_id": "uuid", "tenant_id": "uuid", "media_type": "text",
        "trigger": "text", "started_at": "timestamptz", "ended_at": "timestamptz"}),
    *_cols("call_recordings", [FINALIZE], "write", {
        "file_id": ("text", 1024), "size_bytes": "bigint", "duration_seconds": "integer",
        "format": ("text", 8), "failure_reason": ("text", 7),
        "available_at": "timestamptz", "updated_at": "timestamptz"}),
    Column("call_recordings", "status", "text", frozenset(_BOTH), "write", 9),
    # sessions the finalizer waits for
    *_cols("call_sessions", [FINALIZE], "read", {
        "id": "uuid", "status": "text", "ended_at": "timestamptz",
        "updated_at": "timestamptz"}),
    *_cols("conference_sessions", [FINALIZE], "read", {"updated_at": "timestamptz"}),
    # conferences: the reaper's rows
    *_cols("conference_sessions", _BOTH, "read", {"id": "uuid"}),
    *_cols("conference_sessions", [REAPER], "read", {
        "chat_id": "uuid", "deal_id": "uuid", "tenant_id": "uuid", "media_type": "text",
        "started_by_user_id": "uuid", "created_at": "timestamptz",
        "started_at": "timestamptz", "last_activity_at": "timestamptz",
        "active_participant_count": "integer", "peak_participant_count": "integer"}),
    *_cols("conference_sessions", [REAPER], "write", {
        "end_reason": ("text", 12), "duration_seconds": "integer"}),
    Column("conference_sessions", "status", "text", frozenset(_BOTH), "write", 6),
    Column("conference_sessions", "ended_at", "timestamptz", frozenset(_BOTH), "write"),
    Column("conference_sessions", "updated_at", "timestamptz", frozenset([REAPER]), "write"),
    *_cols("conference_participants", [REAPER], "read", {
        "conference_id": "uuid", "user_id": "uuid", "role": "text",
        "joined_at": "timestamptz", "left_at": "timestamptz"}),
    # the transactional outbox: written with each transition, published by the relay
    *_cols("integration_outbox", _BOTH, "insert", _OUTBOX_INSERT),
    *_cols("integration_outbox", [RELAY], "read", {
        "id": "bigint", "topic": "text", "message_key": "text", "dedupe_key": "text",
        "event_type": "text", "payload": "jsonb", "headers": "jsonb",
        "created_at": "timestamptz"}),
    *_cols("integration_outbox", [RELAY], "write", {
        "published_at": "timestamptz", "publish_attempts": "integer",
        "last_error": ("text", 512)}),
    *_cols("realtime_outbox", _BOTH, "insert", _REALTIME_INSERT),
])

_ACTIVE = "status IN ('Pending', 'Recording', 'Uploading')"
INDEXES: tuple[Index, ...] = (
    # required: ON CONFLICT names these keys; without them the INSERT raises
    Index("ux_outbox_dedupe", "integration_outbox", ("topic", "dedupe_key"),
          frozenset(_BOTH), unique=True, required=True,
          why="ON CONFLICT (topic, dedupe_key): an event is enqueued once"),
    Index("ux_rfa_recording", "recording_finalize_attempts", ("recording_id",),
          frozenset([FINALIZE]), unique=True, required=True,
          why="one finalize row per recording"),
    # recommended: the access paths the claims and gauges are written around
    Index("ix_conf_active", "conference_sessions", ("status", "last_activity_at"),
          frozenset([REAPER]), "status IN ('Provisioning', 'Active')",
          why="the stale-live claim and the backlog gauge"),
    Index("ix_recording_active", "call_recordings", ("session_kind", "session_id"),
          frozenset([FINALIZE, REAPER]), _ACTIVE, why="running recordings of a session"),
    Index("ix_rfa_due", "recording_finalize_attempts", ("status", "next_attempt_at"),
          frozenset([FINALIZE]), why="the finalizer's claim of due rows"),
    Index("ix_outbox_unpublished", "integration_outbox", ("id",), frozenset([RELAY]),
          "published_at IS NULL", why="the relay's claim and idle probe"),
    Index("ix_recording_terminal_updated", "call_recordings", ("updated_at",),
          frozenset([FINALIZE]), "status IN ('Available', 'Failed')",
          why="the auditor's window of terminal recordings"),
    Index("ix_conf_terminal_updated", "conference_sessions", ("updated_at",),
          frozenset([REAPER]), "status IN ('Ended', 'Failed')",
          why="the auditor's window of terminal conferences"),
    Index("ix_outbox_created", "integration_outbox", ("created_at",), frozenset([RELAY]),
          why="the auditor's window of outbox rows"),
    Index("ix_realtime_reference", "realtime_outbox", ("reference_id",),
          frozenset(_BOTH), why="the auditor's realtime rows of a reference"),
    Index("ix_rfa_pending_created", "recording_finalize_attempts", ("created_at",),
          frozenset([FINALIZE]), "status = 'Pending'", why="the oldest-pending gauge"),
    Index("ix_conf_empty_room", "conference_sessions", ("last_activity_at", "id"),
          frozenset([REAPER]), "status = 'Active' AND active_participant_count = 0",
          why="the empty-room claim"),
    Index("ix_conf_provisioning", "conference_sessions", ("created_at", "id"),
          frozenset([REAPER]), "status = 'Provisioning'", why="the provision-timeout claim"),
    Index("ix_recording_session", "call_recordings", ("session_kind", "session_id"),
          frozenset([REAPER]), why="every recording of a reaped conference"),
    Index("ix_outbox_published", "integration_outbox", ("published_at",),
          frozenset([RELAY]), "published_at IS NOT NULL",
          why="outbox retention finds its deletes through it"),
    Index("ix_outbox_live", "integration_outbox", ("id",), frozenset([RELAY]),
          "published_at IS NULL AND (last_error IS NULL OR NOT last_error ^@ 'dead-letter:')",
          why="the relay's claim, idle probe and gauges read live rows only, never the "
              "dead letters (the queries repeat this predicate word for word)"),
    Index("ix_outbox_held", "integration_outbox", ("id",), frozenset([RELAY]),
          "published_at IS NULL AND last_error ^@ 'held:'", why="logical source: rows held "
          "behind a dead letter of their key (few), published after a replay"),
    Index("ix_recording_file_id", "call_recordings", ("file_id",), frozenset(),
          "file_id IS NOT NULL", why="the console's search by file id"),
    Index("ix_rfa_queue", "recording_finalize_attempts", ("status", "next_attempt_at", "id"),
          frozenset(), why="the console's keyset pages of finalize rows: (next_attempt_at, id)"
              " order, bounded however many rows share one next_attempt_at"),
    Index("ix_rfa_quarantined", "recording_finalize_attempts", ("updated_at",), frozenset(),
          "status = 'Quarantined'",
          why="`safetynet status` and the console overview: the oldest quarantined rows"),
)

TABLES: tuple[str, ...] = tuple(dict.fromkeys(c.table for c in COLUMNS))




@attrs.frozen
class Problem:
    """One incompatibility: *subject* (``table.column`` or an index name), what is wrong,
    the DDL that fixes it, the jobs it stops (none for a recommended index)."""

    subject: str
    message: str
    fix: str
    jobs: frozenset[str]
    blocking: bool = True

    def line(self) -> str:
        level = "error" if self.blocking else "warning"
        jobs = ",".join(sorted(self.jobs))
        return f"{level}: {SCHEMA}.{self.subject}: {self.message} [{jobs}] fix: {self.fix}"


@attrs.frozen
class CatalogColumn:
    table: str
    name: str
    type_name: str  # pg_type.typname
    type_kind: str  # pg_type.typtype ('b' base, 'e' enum, 'd' domain)
    formatted: str  # format_type()
    width: int | None  # varchar/bpchar length, None when unbounded
    not_null: bool
    has_default: bool  # a DEFAULT, an identity or a generated column


@attrs.frozen
class CatalogIndex:
    name: str
    table: str
    columns: tuple[str, ...]  # key columns; "" for an expression
    unique: bool
    valid: bool
    method: str
    predicate: str | None


_CASTS = re.compile(
    r"::(?:character varying|character|text|integer|bigint|smallint|numeric|boolean|uuid"
    r"|timestamp with time zone|timestamp without time zone|jsonb)(?:\(\d+\))?(?:\[\])?")


_IN = re.compile(r"(\w+)\)?\s+IN\s*\(([^()]*)\)", re.IGNORECASE)


def normalized_predicate(text: str | None) -> str:
    """A predicate compared modulo casts, parentheses and spacing (PostgreSQL prints
    ``status IN ('a')`` on a varchar column as ``((status)::text = ANY ...)``)."""
    if not text:
        return ""
    text = _IN.sub(r"\1 = ANY (ARRAY[\2])", _CASTS.sub("", text))
    return re.sub(r"[()\s]", "", text)


def serves(found: CatalogIndex, wanted: Index) -> bool:
    """Whether *found* is *wanted* under any name (a unique index serves a plain one)."""
    return (found.table == wanted.table and found.method == "btree"
            and found.columns == wanted.columns
            and (found.unique or not wanted.unique)
            and normalized_predicate(found.predicate) == normalized_predicate(wanted.predicate))


def equivalent(indexes: Iterable[CatalogIndex], wanted: Index) -> list[CatalogIndex]:
    return [i for i in indexes if serves(i, wanted)]


def check(columns: Iterable[CatalogColumn], indexes: Iterable[CatalogIndex]) -> list[Problem]:
    """Every way the live messenger tables (as the catalog lists them) break the contract."""
    by_key = {(c.table, c.name): c for c in columns}
    tables = {c.table for c in by_key.values()}
    problems: list[Problem] = []
    jobs_of_table: dict[str, set[str]] = {}
    for column in COLUMNS:
        jobs_of_table.setdefault(column.table, set()).update(column.jobs)
    for table in TABLES:
        if table not in tables:
            problems.append(Problem(
                table, "table missing",
                "apply the messenger's own migrations (docs/contract.md lists what is read)",
                frozenset(jobs_of_table[table])))
    merged = _merge_columns()
    for (table, name), want in merged.items():
        if table not in tables:
            continue
        got = by_key.get((table, name))
        problems.extend(_column_problems(want, got))
    problems.extend(_unfilled_not_null(by_key.values()))
    listed = list(indexes)
    for index in INDEXES:
        if index.table not in tables:
            continue
        problems.extend(_index_problems(index, listed))
    return problems


def _merge_columns() -> dict[tuple[str, str], Column]:
    """One entry per column: the union of its jobs, the strongest access, the widest need."""
    rank = {"read": 0, "insert": 1, "write": 2}
    merged: dict[tuple[str, str], Column] = {}
    for c in COLUMNS:
        key = (c.table, c.name)
        old = merged.get(key)
        if old is None:
            merged[key] = c
            continue
        merged[key] = attrs.evolve(
            old, jobs=old.jobs | c.jobs,
            access=max(old.access, c.access, key=rank.__getitem__),
            width=max((w for w in (old.width, c.width) if w is not None), default=None),
            family="bigint" if "bigint" in (old.family, c.family) else old.family)
    return merged


def _column_problems(want: Column, got: CatalogColumn | None) -> list[Problem]:
    alter = f"ALTER TABLE {SCHEMA}.{want.table}"
    ddl_type = _DDL_TYPE[want.family]
    if want.family == "text" and want.width:
        ddl_type = f"varchar({want.width})"
    if got is None:
        return [Problem(want.qualified, f"column missing ({want.access}, {want.family})",
                        f"{alter} ADD COLUMN {want.name} {ddl_type};", want.jobs)]
    family = _FAMILY_OF_TYPE.get(got.type_name) if got.type_kind in ("b", "") else None
    accepted = _ACCEPTS.get(want.family, frozenset({want.family}))
    if family not in accepted:
        if want.family == "timestamptz" and got.type_name == "timestamp":
            why = "is timestamp without time zone: safetynet compares instants"
            using = f" USING {want.name} AT TIME ZONE 'UTC'"
        elif want.family == "text" and (family in ("smallint", "integer", "bigint")
                                        or got.type_kind == "e"):
            why = (f"is {got.formatted}: safetynet reads and writes this enum as its names "
                   "(text)")
            using = " USING <map each stored value to its name>"
        else:
            why = f"is {got.formatted}, not {want.family}"
            using = ""
        return [Problem(want.qualified, why,
                        f"{alter} ALTER COLUMN {want.name} TYPE {ddl_type}{using};",
                        want.jobs)]
    if (want.access != "read" and want.width is not None and got.width is not None
            and got.width < want.width):
        return [Problem(want.qualified,
                        f"is {got.formatted}: safetynet writes values up to {want.width} "
                        "characters",
                        f"{alter} ALTER COLUMN {want.name} TYPE varchar({want.width});",
                        want.jobs)]
    return []


def _unfilled_not_null(columns: Iterable[CatalogColumn]) -> list[Problem]:
    """NOT NULL columns without a default in a table safetynet INSERTs into, that its
    INSERTs leave out: every such INSERT would fail."""
    inserted: dict[str, set[str]] = {}
    jobs: dict[str, set[str]] = {}
    for c in COLUMNS:
        if c.access == "insert":
            inserted.setdefault(c.table, set()).add(c.name)
            jobs.setdefault(c.table, set()).update(c.jobs)
    problems = []
    for col in columns:
        if (col.table in inserted and col.not_null and not col.has_default
                and col.name not in inserted[col.table]):
            problems.append(Problem(
                f"{col.table}.{col.name}",
                "NOT NULL without a default: safetynet's INSERTs do not fill it",
                f"ALTER TABLE {SCHEMA}.{col.table} ALTER COLUMN {col.name} SET DEFAULT "
                f"<value>; -- or DROP NOT NULL", frozenset(jobs[col.table])))
    return problems


def _index_problems(index: Index, listed: list[CatalogIndex]) -> list[Problem]:
    same = equivalent(listed, index)
    if any(i.valid for i in same):
        return []
    invalid = [i.name for i in same if not i.valid]
    fix = index.ddl()
    if invalid:
        what = f"only INVALID ({', '.join(invalid)})"
        fix = f"DROP INDEX CONCURRENTLY {SCHEMA}.{invalid[0]}; {fix}"
    else:
        what = "missing"
    role = "required" if index.required else "recommended"
    return [Problem(index.name, f"{role} index {what}: {index.why}", fix + ";",
                    index.jobs if index.required else frozenset(), blocking=index.required)]


def broken_jobs(problems: Iterable[Problem]) -> dict[str, list[str]]:
    """job -> the subjects (``table.column``) that stop it."""
    out: dict[str, list[str]] = {}
    for problem in problems:
        if problem.blocking:
            for job in problem.jobs:
                out.setdefault(job, []).append(problem.subject)
    return out


def catalog_columns(rows: Iterable[Mapping[str, Any]]) -> list[CatalogColumn]:
    return [CatalogColumn(**dict(r)) for r in rows]


def catalog_indexes(rows: Iterable[Mapping[str, Any]]) -> list[CatalogIndex]:
    return [CatalogIndex(**{**dict(r), "columns": tuple(r["columns"])}) for r in rows]
