"""The operator trail (issue #27): one append-only row per operator action.

>>> who = Actor.from_os()                        # the CLI: the OS user, on this host
>>> with conn.transaction():
...     changed = requeue(conn, ids, False)
...     record_action(conn, who, Verb.REQUEUE, ids, "S3 fixed", {"requeued": len(changed)})

``safetynet.operator_actions`` (migration 0012) refuses UPDATE, DELETE and TRUNCATE by a
trigger, whatever the role; the runtime role is granted INSERT and SELECT only. Since
migration 0015 the database sets a row's ``id``, ``at`` and ``db_user`` itself, whatever
the INSERT says, and refuses ids not of the type their verb acts on (:data:`ID_KINDS`),
more than :data:`MAX_IDS` of them, or a result over 256 KiB. :func:`record_action` keeps
within those bounds: the ids are parsed as their kind (:func:`parse_ids`; what is not an
id is counted in the result as ``ids_rejected``, never stored), at most :data:`MAX_IDS`
are named (``ids_total`` counts them all), and the result's lists and strings are cut
(a cut list's length is kept beside it as ``<key>_total``). A verb
writes its row with :func:`record_action` inside the transaction of the action itself,
so the action and its trace commit together or not at all; a refused action (unknown
ids) is recorded in a transaction of its own, with the refusal as its result.

Hooking a new verb is one call in the transaction that does it:
``record_action(conn, who, Verb.X, ids, reason, result)`` (see
:mod:`supervision.app.actions`, where every verb's does).
"""

from __future__ import annotations

import datetime as dt
import enum
import getpass
import json
import os
import re
import socket
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs
import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from supervision.app.queries import ALL_QUERIES

HISTORY_PAGE_MAX = 500
MAX_IDS = 1000  # ids one trail row names (a purge batch); the database refuses more
MAX_LIST = 100  # items of a list in a result (its length is kept beside it)
MAX_TEXT = 1024  # characters of a string in a result
RESULT_BUDGET = 200_000  # bytes of a result's JSON; the database refuses over 262,144


class Origin(enum.StrEnum):
    CLI = "cli"
    CONSOLE = "console"


class Verb(enum.StrEnum):
    REQUEUE = "requeue"
    RELEASE = "release"  # poison conferences
    PAUSE = "pause"
    RESUME = "resume"
    AUDIT = "audit"
    REPLAY = "replay"  # dead letters (a replayed one no longer blocks its key)
    PURGE_DEAD_LETTERS = "purge-dead-letters"  # `safetynet dead-letters --purge`
    RELEASE_KEY = "release-key"  # a key held back by a row in retry, set aside (console)
    ACCEPT_MISSING = "accept-missing"  # Missing verdicts accepted without evidence
    REVOKE_ACCEPTANCE = "revoke-acceptance"  # `safetynet accept-missing --revoke`


class IdKind(enum.StrEnum):
    """What a verb's ids are; the database's trigger (migration 0015) checks the same."""

    UUID = "uuid"  # finalize rows, recordings, conferences
    BIGINT = "bigint"  # outbox ids
    JOB = "job"  # a job's name
    TEXT = "text"  # anything else (an `s3://bucket/prefix` location): 1..1400 characters


ID_KINDS = {Verb.REQUEUE: IdKind.UUID, Verb.RELEASE: IdKind.UUID,
            Verb.REPLAY: IdKind.BIGINT, Verb.PURGE_DEAD_LETTERS: IdKind.BIGINT,
            Verb.RELEASE_KEY: IdKind.BIGINT,
            Verb.PAUSE: IdKind.JOB, Verb.RESUME: IdKind.JOB}
_BIGINT = re.compile(r"[0-9]{1,19}", re.ASCII)
_JOB = re.compile(r"[a-z0-9-]{1,64}", re.ASCII)


@attrs.frozen
class Ids:
    """Ids as given, parsed as their kind: the valid ones (canonical, first occurrence
    only, at most the cap), how many were not ids of the kind, how many were over the
    cap."""

    valid: list[str]
    rejected: int = 0
    omitted: int = 0

    def counts(self, prefix: str = "") -> dict[str, int]:
        """The non-zero counts, for a result (``rejected``, ``omitted``)."""
        return {f"{prefix}{name}": n for name, n in
                (("rejected", self.rejected), ("omitted", self.omitted)) if n}


def parse_ids(kind: IdKind, given: Iterable[object], cap: int = MAX_IDS) -> Ids:
    """*given* parsed as ids of *kind*: a uuid in its canonical form, a bigint in
    decimal; what is not one is counted, never kept."""
    valid: dict[str, None] = {}
    rejected = omitted = 0
    for item in given:
        canonical = canonical_id(kind, item) if isinstance(item, str) else None
        if canonical is None:
            rejected += 1
        elif canonical in valid:
            continue
        elif len(valid) < cap:
            valid[canonical] = None
        else:
            omitted += 1
    return Ids(list(valid), rejected, omitted)


def canonical_id(kind: IdKind, text: str) -> str | None:
    """*text* as an id of *kind* in its canonical form; None when it is not one."""
    if kind is IdKind.UUID:
        try:
            return str(uuid.UUID(text)) if len(text) <= 45 else None
        except ValueError:
            return None
    if kind is IdKind.BIGINT:
        ok = _BIGINT.fullmatch(text) is not None and int(text) < 2**63
        return str(int(text)) if ok else None
    if kind is IdKind.JOB:
        return text if _JOB.fullmatch(text) else None
    return text if 1 <= len(text) <= 1400 else None


@attrs.frozen
class Actor:
    """Who acts and from where: the OS user on a host (cli), a login from an address
    (console)."""

    name: str
    origin: Origin
    client: str | None = None

    @classmethod
    def from_os(cls, explicit: str | None = None) -> Actor:
        """The CLI's actor: *explicit* (``--actor``) or the OS user; the client is the host."""
        return cls(explicit or os_user(), Origin.CLI, socket.gethostname())


def os_user() -> str:
    try:
        return getpass.getuser()
    except (OSError, KeyError):  # no login name (a container without a passwd entry)
        return f"uid:{os.getuid()}"


@attrs.frozen
class Action:
    """One trail row, as read back."""

    id: int
    at: dt.datetime
    actor: str
    db_user: str
    origin: str
    client: str | None
    verb: str
    ids: list[str]
    reason: str | None
    result: dict[str, Any]

    def as_json(self) -> dict[str, Any]:
        data = attrs.asdict(self)
        data["at"] = self.at.isoformat()
        return data


def record_action(conn: psycopg.Connection, who: Actor, verb: Verb, ids: Sequence[str],
                  reason: str | None, result: Mapping[str, Any]) -> int:
    """Append one trail row on *conn* (inside the caller's transaction); its id. The ids
    are parsed as their verb's kind (:data:`ID_KINDS`) and the result is bounded (the
    module's docstring)."""
    named = parse_ids(ID_KINDS.get(verb, IdKind.TEXT), (str(i) for i in ids))
    extra = ({"ids_rejected": named.rejected} if named.rejected else {}) | (
        {"ids_total": len(named.valid) + named.omitted} if named.omitted else {})
    row = conn.execute(ALL_QUERIES["operator_actions_insert"], {
        "actor": who.name, "origin": who.origin.value, "client": who.client,
        "verb": verb.value, "ids": named.valid, "reason": reason,
        "result": Jsonb(bounded_result({**result, **extra}))}).fetchone()
    assert row is not None
    return int(row[0])


def bounded_result(result: Mapping[str, Any]) -> dict[str, Any]:
    """*result* with its lists cut to :data:`MAX_LIST` items (or fewer, until its JSON
    fits :data:`RESULT_BUDGET`) and its strings to :data:`MAX_TEXT` characters."""
    for cap in (MAX_LIST, 10, 1, 0):
        out: dict[str, Any] = _bounded(result, cap)
        if len(json.dumps(out, default=str)) <= RESULT_BUDGET:
            return out
    return {"cut": "result too large to keep"}


def _bounded(value: Any, cap: int) -> Any:
    if isinstance(value, str):
        return value[:MAX_TEXT]
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for key, item in list(value.items())[:MAX_LIST]:
            name = str(key)[:64]
            out[name] = _bounded(item, cap)
            if isinstance(item, list | tuple) and len(item) > cap:
                out[f"{name}_total"] = len(item)
        return out
    if isinstance(value, list | tuple):
        return [_bounded(item, cap) for item in value[:cap]]
    if value is None or isinstance(value, bool | int | float):
        return value
    return str(value)[:MAX_TEXT]


def parse_since(text: str) -> dt.datetime:
    """``--since``: a duration back from now (``24h``) or an ISO date/time (UTC if naive)."""
    from supervision.durations import parse_duration

    try:
        return dt.datetime.now(dt.UTC) - dt.timedelta(seconds=parse_duration(text))
    except ValueError:
        when = dt.datetime.fromisoformat(text)
        return when if when.tzinfo else when.replace(tzinfo=dt.UTC)


def history(conn: psycopg.Connection, *, since: dt.datetime | None = None,
            before: int | None = None, limit: int = 100) -> list[Action]:
    """Trail rows newest first: those with id < *before* (a keyset page), at or after
    *since*; at most *limit* (capped at :data:`HISTORY_PAGE_MAX`)."""
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(ALL_QUERIES["operator_actions_page"], {
            "before": before if before is not None else 2**63 - 1, "since": since,
            "limit": max(1, min(limit, HISTORY_PAGE_MAX))}).fetchall()
    return [Action(**row) for row in rows]
