"""Frozen keys (issue #38 item 2): the outbox keys held back, and what releases each.

>>> found = frozen_keys(conn)
>>> found.keys[0].topic, found.keys[0].kind, found.keys[0].waiting, found.keys[0].release
('pin.recording', 'dead letter', 12, 'safetynet replay 4711 --reason TEXT')

A key is held back behind its first blocker: a dead letter that blocks it (a row the
broker refused for good, or an oversize or malformed row: `safetynet replay` puts it back
and the key follows it), or a row in retry (a transient failure: it goes first once it is
accepted; an operator may set it aside — dead-letter it without blocking the key —, so
the later rows go on without it). The console's frozen-keys page and
``safetynet dead-letters --keys`` show the same list; the reads are bounded (the first
:data:`SCAN` unpublished rows, :data:`SCAN` blocking dead letters).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

import attrs
import psycopg
from psycopg.rows import dict_row

from actors.outbox.queries import OUTBOX_QUERIES

SCAN = 10_000
DEAD_LETTER, RETRY = "dead letter", "retry"


@attrs.frozen
class FrozenKey:
    topic: str
    message_key: str
    since: dt.datetime
    blocker_id: int
    kind: str  # DEAD_LETTER or RETRY
    error: str
    attempts: int | None
    waiting: int  # unpublished rows behind the blocker (among the first SCAN)

    @property
    def release(self) -> str:
        """What releases the key, as an operator types it."""
        if self.kind == DEAD_LETTER:
            return f"safetynet replay {self.blocker_id} --reason TEXT"
        return (f"let its retry succeed, or set it aside in the console (/outbox/keys): "
                f"row {self.blocker_id}")

    def as_json(self) -> dict[str, Any]:
        return {**attrs.asdict(self), "since": self.since.isoformat(),
                "release": self.release}


@attrs.frozen
class FrozenKeys:
    keys: list[FrozenKey]
    total: int  # keys held back in all (the list shows the first ones)


def frozen_keys(conn: psycopg.Connection, limit: int = 50) -> FrozenKeys:
    """The keys held back, longest-held first, at most *limit*."""
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(OUTBOX_QUERIES["outbox_frozen_keys"],
                           {"scan": SCAN, "limit": max(1, limit)}).fetchall()
    keys = [FrozenKey(r["topic"], r["message_key"], r["since"], int(r["blocker_id"]),
                      r["kind"], r["error"] or "", r["attempts"], int(r["waiting"]))
            for r in rows]
    return FrozenKeys(keys, int(rows[0]["total"]) if rows else 0)


def report(found: FrozenKeys, as_json: bool) -> list[str]:
    """``safetynet dead-letters --keys``: one line per key (or one JSON object)."""
    import json

    if as_json:
        return [json.dumps({"total": found.total,
                            "keys": [key.as_json() for key in found.keys]})]
    lines = [f"{key.topic}/{key.message_key}: {key.waiting} waiting since "
             f"{key.since.isoformat()} behind {key.blocker_id} ({key.kind}"
             f"{f', {key.attempts} attempt(s)' if key.attempts is not None else ''}: "
             f"{key.error}) — release: {key.release}" for key in found.keys]
    shown = f" ({len(found.keys)} shown)" if found.total > len(found.keys) else ""
    return [*lines, f"{found.total} key(s) held back{shown}"]


def set_aside(conn: psycopg.Connection, outbox_ids: Sequence[int]) -> list[int]:
    """Dead-letter the rows in retry *outbox_ids* that are still unpublished and failing,
    without blocking their keys, and wake the relays (in the caller's transaction); the
    ids set aside."""
    done = [int(r[0]) for r in conn.execute(OUTBOX_QUERIES["outbox_set_aside"],
                                            {"ids": list(outbox_ids)}).fetchall()]
    if done:
        conn.execute(OUTBOX_QUERIES["outbox_wake_relays"])  # delivered at commit
    return sorted(done)
