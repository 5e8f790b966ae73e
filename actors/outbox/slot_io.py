"""The logical source's database work: peek the slot, advance it, find blocked keys.

>>> peeked = await db.run(peek_slot, source, upto_n)      # not consumed, not fenced
>>> confirmed = await db.atomic(advance_slot, source, lsn)  # behind the lease's fence

Each is one short call on an ordinary connection (``pg_logical_slot_peek_binary_changes``,
``pg_replication_slot_advance``). A slot serves one session at a time: the cycle's reader
and advancer take turns through one :class:`trio.Lock`, and a slot held by another
session (a fenced leader still peeking) is an :class:`InfrastructureError` that ends the
cycle, tried again on the next one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
import psycopg

from actors.outbox.logical_setup import LogicalSource
from actors.outbox.queries import OUTBOX_QUERIES
from actors.outbox.rows import Key
from supervision.errors import InfrastructureError

FLUSH_FROM_VERSION = 170000  # pg_logical_emit_message(..., flush) is new in PostgreSQL 17


@attrs.frozen
class Peeked:
    """One peek: the WAL position read before it, the slot's confirmed position and the
    messages (LSN, pgoutput bytes) past it."""

    wal_position: int
    confirmed: int
    records: list[tuple[int, bytes]]
    xmin: int = 0  # every transaction id below it had ended before wal_position


def _slot_in_use(source: LogicalSource, exc: psycopg.Error) -> InfrastructureError:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return InfrastructureError(f"postgres: replication slot {source.slot}: {first}")


class SlotGone(InfrastructureError):
    """The slot does not exist, or PostgreSQL invalidated it (``wal_status = 'lost'``):
    the relay falls back to the table (:mod:`actors.outbox.handover`)."""


def slot_confirmed(conn: psycopg.Connection[Any], source: LogicalSource) -> int:
    row = conn.execute(OUTBOX_QUERIES["outbox_slot_describe"], {"slot": source.slot}
                       ).fetchone()
    if row is None:
        raise SlotGone(f"postgres: replication slot {source.slot} does not exist "
                       "(safetynet migrate creates it)")
    if row[3] == "lost":
        raise SlotGone(f"postgres: replication slot {source.slot} was invalidated "
                       "(wal_status lost: it retained more than max_slot_wal_keep_size)")
    return int(row[5])


def slot_active(conn: psycopg.Connection[Any], source: LogicalSource) -> bool:
    """Whether a session (a walsender) holds the slot now."""
    row = conn.execute(OUTBOX_QUERIES["outbox_slot_describe"], {"slot": source.slot}
                       ).fetchone()
    return bool(row and row[4])


def wal_mark(conn: psycopg.Connection[Any]) -> tuple[int, int]:
    """The current WAL position and the oldest transaction id running before it was read
    (every transaction below it had ended by then)."""
    flush = conn.info.server_version >= FLUSH_FROM_VERSION
    row = conn.execute(OUTBOX_QUERIES["outbox_slot_wal_flush" if flush else
                                      "outbox_slot_wal_position"]).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def peek_slot(conn: psycopg.Connection[Any], source: LogicalSource, upto_n: int) -> Peeked:
    """Up to about *upto_n* messages past the slot's confirmed position (whole
    transactions), not consumed. On PostgreSQL 17 and later the WAL is flushed first, so
    a transaction committed with ``synchronous_commit = off`` is not missed."""
    flush = conn.info.server_version >= FLUSH_FROM_VERSION
    position = conn.execute(OUTBOX_QUERIES["outbox_slot_wal_flush" if flush else
                                           "outbox_slot_wal_position"]).fetchone()
    assert position is not None
    confirmed = slot_confirmed(conn, source)
    try:
        records = conn.execute(OUTBOX_QUERIES["outbox_slot_peek"],
                               {"slot": source.slot, "upto_n": upto_n,
                                "publication": source.publication},
                               binary=True).fetchall()  # bytea as bytes, not hex text
    except psycopg.errors.ObjectInUse as exc:
        raise _slot_in_use(source, exc) from exc
    return Peeked(int(position[0]), confirmed,
                  [(int(lsn), bytes(data)) for lsn, data in records], int(position[1]))


def advance_slot(conn: psycopg.Connection[Any], source: LogicalSource, lsn: int) -> int:
    """Move the slot's confirmed position to *lsn* (never back); the new position. Run
    through :meth:`Database.atomic` on a fenced database: the fence is checked first, in
    the same transaction, so a fenced leader never moves the slot (the move itself is
    not transactional: it stays even if the transaction rolls back after it)."""
    try:
        row = conn.execute(OUTBOX_QUERIES["outbox_slot_advance"],
                           {"slot": source.slot, "lsn": lsn}).fetchone()
    except psycopg.errors.ObjectInUse as exc:
        raise _slot_in_use(source, exc) from exc
    if row is None:
        raise InfrastructureError(f"postgres: replication slot {source.slot} does not exist")
    return int(row[0])


def may_snapshot(conn: psycopg.Connection[Any]) -> bool:
    """Whether this role may log standby snapshots (:func:`log_snapshot`)."""
    try:
        with conn.transaction():
            row = conn.execute(OUTBOX_QUERIES["outbox_slot_may_snapshot"]).fetchone()
    except psycopg.errors.UndefinedFunction:  # a server without it
        return False
    return bool(row and row[0])


def log_snapshot(conn: psycopg.Connection[Any]) -> int | None:
    """Write a running-transactions record to the WAL, so the slot's restart position
    can follow its confirmed one (a peek, a move and a new stream all decode from the
    restart position: without this it moves only with the background writer's record,
    every 15 s, and each decodes up to 15 s of WAL again); the record's WAL position.
    None when the role may not (any more)."""
    try:
        with conn.transaction():  # a savepoint: a refusal leaves the transaction usable
            row = conn.execute(OUTBOX_QUERIES["outbox_slot_snapshot"]).fetchone()
    except psycopg.errors.InsufficientPrivilege:
        return None
    assert row is not None
    return int(row[0])


def blocking_keys(conn: psycopg.Connection[Any], keys: Sequence[Key]) -> dict[Key, int]:
    """Of *keys*, those a dead letter blocks, with the lowest blocking outbox id (the
    dead letter's own topic and key are kept to 249 and 400 characters, as the table
    source compares them)."""
    if not keys:
        return {}
    rows = conn.execute(OUTBOX_QUERIES["outbox_dead_letters_blocking_keys"],
                        {"topics": [k[0] for k in keys], "keys": [k[1] for k in keys]}
                        ).fetchall()
    found = {(topic, key): int(outbox_id) for topic, key, outbox_id in rows}
    return {k: found[(k[0][:249], k[1][:400])] for k in keys
            if (k[0][:249], k[1][:400]) in found}


def anything_blocking(conn: psycopg.Connection[Any]) -> bool:
    """Whether any key is blocked by a dead letter or held rows (the cycle's probe)."""
    row = conn.execute(OUTBOX_QUERIES["outbox_anything_blocking"]).fetchone()
    return bool(row and row[0])


def slot_idle(conn: psycopg.Connection[Any], source: LogicalSource, after_id: int,
              max_retained: int) -> bool:
    """The logical source's idle probe: no outbox row above *after_id* and the slot holds
    back less than *max_retained* bytes of WAL (no slot: not idle, the cycle says why)."""
    row = conn.execute(OUTBOX_QUERIES["outbox_slot_idle"],
                       {"slot": source.slot, "after_id": after_id,
                        "max_retained": max_retained}).fetchone()
    return bool(row and row[0])
