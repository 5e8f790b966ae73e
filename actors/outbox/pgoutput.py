"""A decoder of PostgreSQL's ``pgoutput`` logical replication messages, protocol version 1.

>>> decode(b"B" + struct.pack("!qqi", lsn, micros, xid))
Begin(final_lsn=..., commit_time=datetime(...), xid=...)

What ``pg_logical_slot_peek_binary_changes(slot, NULL, n, 'proto_version', '1',
'publication_names', pub)`` returns in its ``data`` column: one message per row, in the
documented format ("Logical Replication Message Formats" in the PostgreSQL manual; the
format of version 1 has not changed since PostgreSQL 10). The relay needs Begin (its
commit time), Commit (its end LSN: the slot may advance there once every event of the
transaction is settled), Relation (which table an Insert is of, and its columns) and
Insert (the new row's columns). Every other message a publication can send — Origin,
Type, Update, Delete, Truncate, a logical decoding Message — comes back as
:class:`Skipped` with its tag; the relay's publication publishes inserts only.

A column value of an Insert is its text output (bytes, in the database's encoding) for
``t``, ``None`` for ``n`` (SQL NULL) and :data:`UNCHANGED` for ``u`` (a TOASTed value not
sent: only in updates). Binary values (``b``) are never requested and are malformed.

Anything that does not parse — a short message, an unknown tag, trailing bytes, a string
without its terminator — raises :class:`PgOutputError` naming the message and what is
wrong; nothing is guessed. Why not ``pgoutput-decoder`` (PyPI, 0.1.0): docs/architecture.md.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Final, cast

import attrs

from supervision.errors import SafetynetError

__all__ = ["UNCHANGED", "Begin", "Column", "Commit", "Insert", "Message", "PgOutputError",
           "Relation", "Skipped", "Unchanged", "begin_fields", "commit_end", "decode",
           "epoch_seconds", "format_lsn", "insert_texts"]

PG_EPOCH: Final = datetime(2000, 1, 1, tzinfo=UTC)  # pgoutput's timestamps count from here
PG_EPOCH_UNIX: Final = PG_EPOCH.timestamp()
SKIPPED_TAGS: Final = frozenset(b"OYUDTM")  # Origin, Type, Update, Delete, Truncate, Message

_BEGIN = struct.Struct("!qqI")  # final LSN, commit time (µs since 2000), xid
_COMMIT = struct.Struct("!Bqqq")  # flags, commit LSN, end LSN, commit time
_INT8 = struct.Struct("!B")
_INT16 = struct.Struct("!h")
_INT32 = struct.Struct("!I")
_COLUMN_TAIL = struct.Struct("!Ii")  # type oid, type modifier


class PgOutputError(SafetynetError):
    """A pgoutput message could not be decoded."""


class Unchanged:
    """A TOASTed column value the message does not carry (``u``)."""

    _instance: Unchanged | None = None

    def __new__(cls) -> Unchanged:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNCHANGED"


UNCHANGED: Final = Unchanged()
Value = bytes | None | Unchanged


@attrs.frozen
class Begin:
    """A transaction's first message: the LSN of its commit record, when it committed."""

    final_lsn: int
    commit_time: datetime
    xid: int


@attrs.frozen
class Commit:
    """A transaction's last message; *end_lsn* is the position just past its commit."""

    flags: int
    commit_lsn: int
    end_lsn: int
    commit_time: datetime


@attrs.frozen
class Column:
    flags: int  # 1: part of the replica identity key
    name: str
    type_oid: int
    type_modifier: int

    @property
    def is_key(self) -> bool:
        return bool(self.flags & 1)


@attrs.frozen
class Relation:
    """A table's description, sent before the first change of it in a decoding session."""

    relation_id: int
    namespace: str
    name: str
    replica_identity: str
    columns: tuple[Column, ...]


@attrs.frozen
class Insert:
    """A new row: its relation's id and one value per column, in the relation's order."""

    relation_id: int
    values: tuple[Value, ...]


@attrs.frozen
class Skipped:
    """A message the relay has no use for (its tag: ``O``, ``Y``, ``U``, ``D``, ``T``,
    ``M``)."""

    tag: str


Message = Begin | Commit | Relation | Insert | Skipped


def format_lsn(lsn: int) -> str:
    """An LSN as PostgreSQL writes it (``16/B374D848``)."""
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def _time(micros: int) -> datetime:
    return PG_EPOCH + timedelta(microseconds=micros)


class _Reader:
    """Reads a message's fields in order; every short read is a :class:`PgOutputError`."""

    __slots__ = ("data", "kind", "pos")

    def __init__(self, data: bytes, kind: str) -> None:
        self.data, self.kind, self.pos = data, kind, 1

    def fail(self, problem: str) -> PgOutputError:
        return PgOutputError(f"pgoutput {self.kind} message of {len(self.data)} bytes: "
                             f"{problem} at byte {self.pos}")

    def unpack(self, fmt: struct.Struct) -> tuple[int, ...]:
        if self.pos + fmt.size > len(self.data):
            raise self.fail(f"{fmt.size} bytes expected, {len(self.data) - self.pos} left")
        values = fmt.unpack_from(self.data, self.pos)
        self.pos += fmt.size
        return values

    def number(self, fmt: struct.Struct) -> int:
        return self.unpack(fmt)[0]

    def string(self) -> str:
        end = self.data.find(b"\0", self.pos)
        if end < 0:
            raise self.fail("string without its terminating zero byte")
        raw = self.data[self.pos:end]
        self.pos = end + 1
        try:
            return raw.decode()
        except UnicodeDecodeError as exc:
            raise self.fail(f"string not UTF-8 ({exc.reason})") from None

    def take(self, length: int) -> bytes:
        if length < 0 or self.pos + length > len(self.data):
            raise self.fail(f"value of {length} bytes, {len(self.data) - self.pos} left")
        raw = self.data[self.pos:self.pos + length]
        self.pos += length
        return raw

    def done(self) -> None:
        if self.pos != len(self.data):
            raise self.fail(f"{len(self.data) - self.pos} bytes left over")


def decode(data: bytes) -> Message:
    """One pgoutput message (protocol version 1) as a typed value; raises
    :class:`PgOutputError` when it is malformed."""
    if not data:
        raise PgOutputError("pgoutput message of 0 bytes: no tag")
    tag = data[0]
    if tag in SKIPPED_TAGS:
        return Skipped(chr(tag))
    parse = _PARSERS.get(tag)
    if parse is None:
        raise PgOutputError(f"pgoutput message of {len(data)} bytes: unknown tag "
                            f"{bytes([tag])!r}")
    reader = _Reader(data, _NAMES[tag])
    message = parse(reader)
    reader.done()
    return message


def insert_texts(data: bytes, upto: int) -> list[bytes | None] | None:
    """An Insert's first *upto* columns when each is a text value or a null, read in one
    pass with no message built (the columns after them are not read) — on the relay's
    path for every event; None for anything else (an unchanged TOAST value, a message
    with fewer columns or cut short: :func:`decode` then reads it, every read checked)."""
    if data[:1] != b"I" or data[5:6] != b"N" or len(data) < 8:
        return None
    if _INT16.unpack_from(data, 6)[0] < upto:
        return None
    read = _fast_columns(data, 8, upto, unchanged=False)
    return None if read is None else cast(list[bytes | None], read[0])


def begin_fields(data: bytes) -> tuple[int, int] | None:
    """A Begin's final LSN and commit time (µs since 2000) without building a message —
    on the relay's path once per transaction; None when *data* is not a well-formed Begin
    (:func:`decode` then says why)."""
    if data[:1] != b"B" or len(data) != 1 + _BEGIN.size:
        return None
    final_lsn, micros, _ = _BEGIN.unpack_from(data, 1)
    return final_lsn, micros


def commit_end(data: bytes) -> int | None:
    """A Commit's end LSN without building a message; None when *data* is not a
    well-formed Commit."""
    if data[:1] != b"C" or len(data) != 1 + _COMMIT.size:
        return None
    return int(_COMMIT.unpack_from(data, 1)[2])


def epoch_seconds(micros: int) -> float:
    """pgoutput's timestamp (µs since 2000-01-01 UTC) as seconds since the Unix epoch."""
    return PG_EPOCH_UNIX + micros / 1_000_000


def _begin(r: _Reader) -> Begin:
    final_lsn, micros, xid = r.unpack(_BEGIN)
    return Begin(final_lsn, _time(micros), xid)


def _commit(r: _Reader) -> Commit:
    flags, commit_lsn, end_lsn, micros = r.unpack(_COMMIT)
    return Commit(flags, commit_lsn, end_lsn, _time(micros))


def _relation(r: _Reader) -> Relation:
    relation_id = r.number(_INT32)
    namespace, name = r.string(), r.string()
    identity = chr(r.number(_INT8))
    count = r.number(_INT16)
    if count < 0:
        raise r.fail(f"{count} columns")
    columns = []
    for _ in range(count):
        flags = r.number(_INT8)
        column = r.string()
        type_oid, modifier = r.unpack(_COLUMN_TAIL)
        columns.append(Column(flags, column, type_oid, modifier))
    return Relation(relation_id, namespace or "pg_catalog", name, identity, tuple(columns))


def _insert(r: _Reader) -> Insert:
    relation_id = r.number(_INT32)
    marker = r.take(1)
    if marker != b"N":
        raise r.fail(f"new tuple marker {marker!r}, not b'N'")
    return Insert(relation_id, _tuple(r))


def _tuple(r: _Reader) -> tuple[Value, ...]:
    """TupleData: a column count, then per column ``n``, ``u`` or ``t`` + length + text.
    On the relay's path for every event: one pass (:func:`_fast_columns`); anything odd
    is read again by :func:`_tuple_checked`, which names it."""
    count = r.number(_INT16)
    if count >= 0:
        read = _fast_columns(r.data, r.pos, count, unchanged=True)
        if read is not None:
            r.pos = read[1]
            return tuple(read[0])
    return _tuple_checked(r, count)


def _fast_columns(data: bytes, pos: int, count: int, *, unchanged: bool
                  ) -> tuple[list[Value], int] | None:
    """*count* columns of TupleData from *pos*, with local names and no bounds check per
    column (a short message shows as an index or struct error, or a position past the
    end): their values and the position after them; None at anything odd (a column kind
    other than ``t`` and ``n``, or ``u`` when *unchanged* is false)."""
    unpack = _INT32.unpack_from
    values: list[Value] = []
    append = values.append
    try:
        for _ in range(count):
            kind = data[pos]
            if kind == 0x74:  # t
                length = unpack(data, pos + 1)[0]
                pos += 5
                append(data[pos:pos + length])
                pos += length
            elif kind == 0x6E:  # n
                pos += 1
                append(None)
            elif kind == 0x75 and unchanged:  # u
                pos += 1
                append(UNCHANGED)
            else:
                return None
    except (IndexError, struct.error):
        return None
    return (values, pos) if pos <= len(data) else None


def _tuple_checked(r: _Reader, count: int) -> tuple[Value, ...]:
    """:func:`_tuple`, every read checked: raises :class:`PgOutputError` naming what is
    wrong where."""
    if count < 0:
        raise r.fail(f"{count} columns")
    data, pos, end = r.data, r.pos, len(r.data)
    unpack = _INT32.unpack_from
    values: list[Value] = []
    append = values.append
    for _ in range(count):
        kind = data[pos] if pos < end else -1
        pos += 1
        if kind == 0x74:  # t
            if pos + 4 > end:
                r.pos = pos
                raise r.fail(f"4 bytes expected, {max(end - pos, 0)} left")
            length = unpack(data, pos)[0]
            pos += 4
            if pos + length > end:
                r.pos = pos
                raise r.fail(f"value of {length} bytes, {end - pos} left")
            append(data[pos:pos + length])
            pos += length
        elif kind == 0x6E:  # n
            append(None)
        elif kind == 0x75:  # u
            append(UNCHANGED)
        else:
            r.pos = pos - 1
            shown = bytes([kind]) if kind >= 0 else b""
            raise r.fail(f"column kind {shown!r} (expected b'n', b'u' or b't')")
    r.pos = pos
    return tuple(values)


_PARSERS: dict[int, Callable[[_Reader], Message]] = {
    ord("B"): _begin, ord("C"): _commit, ord("R"): _relation, ord("I"): _insert}
_NAMES = {ord("B"): "Begin", ord("C"): "Commit", ord("R"): "Relation", ord("I"): "Insert"}
