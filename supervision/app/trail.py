"""The operator trail (issue #27): one append-only row per operator action.

>>> who = Actor.from_os()                        # the CLI: the OS user, on this host
>>> with conn.transaction():
...     changed = requeue(conn, ids, False)
...     record_action(conn, who, Verb.REQUEUE, ids, "S3 fixed", {"requeued": len(changed)})

``safetynet.operator_actions`` (migration 0012) refuses UPDATE, DELETE and TRUNCATE by a
trigger, whatever the role; the runtime role is granted INSERT and SELECT only. A verb
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
import os
import socket
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from supervision.app.queries import ALL_QUERIES

HISTORY_PAGE_MAX = 500


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
    RELEASE_KEY = "release-key"  # a blocked outbox key (no verb of its own: replay does it)
    ACCEPT_MISSING = "accept-missing"  # Missing verdicts accepted without evidence
    REVOKE_ACCEPTANCE = "revoke-acceptance"  # `safetynet accept-missing --revoke`


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
    """Append one trail row on *conn* (inside the caller's transaction); its id."""
    row = conn.execute(ALL_QUERIES["operator_actions_insert"], {
        "actor": who.name, "origin": who.origin.value, "client": who.client,
        "verb": verb.value, "ids": [str(i) for i in ids], "reason": reason,
        "result": Jsonb(dict(result))}).fetchone()
    assert row is not None
    return int(row[0])


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
