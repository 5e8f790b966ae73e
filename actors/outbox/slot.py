"""The logical source's pure part: outbox rows out of pgoutput messages, and how far the
slot may advance.

>>> txns = transactions(peeked, max_row_bytes)        # [(lsn, data), ...] → [Txn, ...]
>>> skip = progress.add(txn.end_lsn, [row.id for row in txn.rows])
>>> progress.settle([42]); progress.passable()         # the slot may move up to here

:func:`transactions` decodes one peek (:mod:`actors.outbox.pgoutput`): a transaction per
Begin…Commit, in commit order, with its commit time and the end LSN of its commit record,
and its inserts into ``messenger.integration_outbox`` as the claim would have built them
(:func:`actors.outbox.rows.parse_claimed`: the same checks, the same message; a row over
the producer's max request size is :class:`~actors.outbox.rows.Malformed`).

:class:`SlotProgress` is the at-least-once rule: the slot's confirmed position only ever
moves to the end of a transaction whose every event, and every earlier transaction's,
was acknowledged by Kafka, dead-lettered or passed as part of a blocked key. Events
settled above the confirmed position (a later key went on while an earlier one waits for
its back-off) are remembered across cycles, so a cycle that reads them again does not send
them again; after a restart they are sent again (duplicates bounded by what was settled
above the slot's position).
"""

from __future__ import annotations

import json
import math
import struct
from collections import deque
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any, cast

import attrs

from actors.outbox.pgoutput import (
    PG_EPOCH,
    UNCHANGED,
    Insert,
    PgOutputError,
    Relation,
    Unchanged,
    begin_fields,
    commit_end,
    decode,
    epoch_seconds,
    format_lsn,
    insert_texts,
)
from actors.outbox.rows import (
    Malformed,
    Row,
    json_type,
    object_row,
    parse_claimed,
    string_object,
)

OUTBOX_RELATION = ("messenger", "integration_outbox")
MAX_MARKS = 64  # WAL marks kept until the slot passes them (older ones give way)
_RELID = struct.Struct("!I")  # an Insert's relation id, after its tag
COLUMNS = ("id", "topic", "message_key", "dedupe_key", "event_type", "payload", "headers")


@attrs.define
class Txn:
    """One committed transaction of the outbox: its inserts in order, decoded on demand
    (:meth:`decode`), so a large transaction is handed on in pieces while it is read."""

    end_lsn: int
    commit_micros: int  # the commit time as pgoutput sends it: µs since 2000-01-01 UTC
    # (pgoutput Insert, the relay's column positions: a tuple of ints, so that once
    # read, the pair is out of the garbage collector's sight)
    inserts: list[tuple[bytes, tuple[int, ...]]]
    max_row_bytes: int

    @property
    def commit_time(self) -> datetime:
        return PG_EPOCH + timedelta(microseconds=self.commit_micros)

    @property
    def committed_at(self) -> float:
        """The commit time in seconds since the Unix epoch (the delivery histogram's)."""
        return epoch_seconds(self.commit_micros)

    @property
    def rows(self) -> list[Row | Malformed]:
        """Every row of the transaction."""
        return self.decode(0, len(self.inserts))

    def decode(self, start: int, stop: int) -> list[Row | Malformed]:
        """Rows *start* to *stop* (insert order), as the claim would have built them;
        raises :class:`~actors.outbox.pgoutput.PgOutputError` for one that does not
        decode."""
        rows: list[Row | Malformed] = []
        append, limit = rows.append, self.max_row_bytes
        for data, positions in self.inserts[start:stop]:
            row = _fast_row(data, positions, limit)  # the common case: no message built
            if row is None:
                message = decode(data)
                assert isinstance(message, Insert)
                append(outbox_row(message, positions, limit))
            else:
                append(row)
        return rows


def _fast_row(data: bytes, positions: tuple[int, ...], max_row_bytes: int) -> Row | None:
    """The row of an Insert whose relay columns are text values (:func:`insert_texts`)
    when it is the common case (:func:`_object_row`); None for anything else, which
    :func:`decode` and :func:`outbox_row` then read, every read checked."""
    texts = insert_texts(data, max(positions) + 1)
    if texts is None:
        return None
    raw = [texts[at] for at in positions]
    if None in raw:
        return None
    return _object_row(cast(list[bytes], raw), max_row_bytes)


def transactions(records: Iterable[tuple[int, bytes]], max_row_bytes: int,
                 after: int = 0, relations: dict[int, tuple[int, ...] | None] | None = None
                 ) -> list[Txn]:
    """The complete transactions of one peek that end past *after* (a trailing one
    without its Commit is left out: the next peek returns it whole), with their inserts
    into the outbox found but not decoded (:meth:`Txn.decode`). Raises
    :class:`~actors.outbox.pgoutput.PgOutputError` for a Begin, Commit or Relation that
    does not decode, or an insert of a relation not described before it (in these
    records, or in *relations*: a stream describes each relation once, and the caller
    keeps them from one call to the next)."""
    if relations is None:  # relid → column positions (None: not the outbox)
        relations = {}
    done: list[Txn] = []
    current: Txn | None = None
    skipping = False  # in a transaction read already (its commit is before *after*)
    for lsn, data in records:
        tag = data[:1]
        if tag == b"I":
            if not skipping:
                positions = _insert_positions(relations, lsn, data)
                if positions is not None and current is not None:
                    current.inserts.append((data, positions))
            continue
        begin = begin_fields(data) if tag == b"B" else None
        end_lsn = commit_end(data) if tag == b"C" else None
        if begin is None and end_lsn is None:  # anything else, or a malformed one
            message = decode(data)
            if isinstance(message, Relation):
                relations[message.relation_id] = _positions(message)
            continue
        if begin is not None:
            skipping = begin[0] < after
            current = None if skipping else Txn(0, begin[1], [], max_row_bytes)
        else:
            if current is not None:
                current.end_lsn = end_lsn or 0
                done.append(current)
            current = None
    return done


def _insert_positions(relations: dict[int, tuple[int, ...] | None], lsn: int, data: bytes
                      ) -> tuple[int, ...] | None:
    """The column positions of an Insert's relation (None: not the outbox's)."""
    if len(data) < 1 + _RELID.size:
        decode(data)  # raises, naming what is short
    relation_id = _RELID.unpack_from(data, 1)[0]
    if relation_id not in relations:
        raise PgOutputError(f"pgoutput Insert at {format_lsn(lsn)}: relation "
                            f"{relation_id} not described before it")
    return relations[relation_id]


@attrs.frozen
class Span:
    """Events *start* to *stop* of a transaction (stop == its length: its last ones)."""

    txn: Txn
    start: int
    stop: int


@attrs.frozen
class Piece:
    """What the reader hands on at once: at most a batch of events, in commit order."""

    spans: list[Span]
    last: bool  # the peek's last piece


def pieces(txns: Sequence[Txn], size: int) -> list[Piece]:
    """*txns* cut into pieces of at most *size* events each, in order: a large
    transaction spans several pieces, small ones share one (a transaction without outbox
    events is an empty span, so the slot may pass it)."""
    cut: list[list[Span]] = [[]]
    count = 0
    for txn in txns:
        start, total = 0, len(txn.inserts)
        while True:
            if count >= size:
                cut.append([])
                count = 0
            stop = min(total, start + size - count)
            cut[-1].append(Span(txn, start, stop))
            count += stop - start
            start = stop
            if start >= total:
                break
    return [Piece(spans, n == len(cut) - 1) for n, spans in enumerate(cut)]


def _positions(relation: Relation) -> tuple[int, ...] | None:
    """Where the relay's columns are in the outbox's tuples (None: another table)."""
    if (relation.namespace, relation.name) != OUTBOX_RELATION:
        return None
    names = [column.name for column in relation.columns]
    missing = [name for name in COLUMNS if name not in names]
    if missing:
        raise PgOutputError(f"pgoutput Relation {relation.namespace}.{relation.name}: no "
                            f"column {', '.join(missing)}")
    return tuple(names.index(name) for name in COLUMNS)


def _text(value: bytes | Unchanged | None) -> str | None:
    if isinstance(value, Unchanged):
        raise PgOutputError("pgoutput Insert: an outbox column came as unchanged TOAST")
    return None if value is None else value.decode()


def outbox_row(insert: Insert, positions: Sequence[int], max_row_bytes: int
               ) -> Row | Malformed:
    """An inserted outbox row as the claim builds it (``outbox_claim_batch``'s record)."""
    if len(insert.values) <= max(positions):
        raise PgOutputError(f"pgoutput Insert of {len(insert.values)} columns: fewer than "
                            "its relation's")
    raw = [insert.values[at] for at in positions]
    if None not in raw and UNCHANGED not in raw:  # every column a text value
        row = _object_row(cast(list[bytes], raw), max_row_bytes)
        if row is not None:
            return row
    size = sum(len(v) for v in raw[1:] if isinstance(v, bytes))
    texts = [_text(v) for v in raw]
    outbox_id, topic, key, dedupe, event_type, payload, headers = texts
    if outbox_id is None or topic is None or key is None:
        raise PgOutputError("pgoutput Insert: an outbox row without its id, topic or key")
    oversized = size > max_row_bytes
    record: tuple[Any, ...] = (
        int(outbox_id), topic, key, dedupe, event_type, None if oversized else payload,
        _payload_type(payload), None if oversized else headers, size, oversized, 0)
    return parse_claimed(record, max_row_bytes)


def _object_row(raw: list[bytes], max_row_bytes: int) -> Row | None:
    """The common case straight from the message's bytes (the payload and the key go to
    Kafka as they came, not decoded and encoded again): an object payload within the
    size limit, headers a JSON object of strings; None for anything else."""
    outbox_id, topic, key, dedupe, event_type, payload, headers = raw
    if payload[:1] != b"{" or sum(map(len, raw)) - len(outbox_id) > max_row_bytes:
        return None
    decoded = string_object(headers)
    if decoded is None:
        return None
    try:
        topic_text, key_text = topic.decode(), key.decode()
    except UnicodeDecodeError:
        return None
    return object_row(int(outbox_id), topic_text, key_text, key, payload, decoded,
                      event_type, dedupe)


def _payload_type(payload: str | None) -> str:
    """``jsonb_typeof`` of jsonb's text output: an object's starts with ``{``."""
    if payload is None:
        return "null"
    if payload.startswith("{"):
        return "object"
    try:
        return json_type(json.loads(payload))
    except ValueError:
        return "invalid"


@attrs.define
class _Open:
    end_lsn: int
    pending: set[int]
    read: int = 0  # events of it read in this cycle (settled or not)
    complete: bool = True  # every event of it read (a large one is read in pieces)


@attrs.define
class SlotProgress:
    """What the logical source has read above the slot's confirmed position, and what of
    it is settled (acknowledged, dead-lettered, passed behind a blocked key).

    Lives in the relay's state: *settled* survives cycles (the ids settled above the
    confirmed position, by their transaction's end LSN); the rest is per cycle
    (:meth:`begin_cycle`)."""

    confirmed: int = 0
    read_upto: int = 0  # end LSN of the last transaction read in this cycle
    max_id: int = 0  # the highest outbox id read (the idle probe's mark)
    idle_upto: int = 0  # a WAL position up to which no outbox change is left to read
    settled: dict[int, set[int]] = attrs.field(factory=dict)
    # the hand-over (actors.outbox.handover): every transaction id below passed_xid has
    # been passed by the slot; the source recorded in the database (None: not read yet)
    passed_xid: int | None = None
    recorded_source: str | None = None
    recorded_xid: int | None = None
    recorded_at: float = -math.inf
    # standby snapshots (actors.outbox.logical): whether this role may log them (None: not
    # asked yet), and when it may next log one, or ask again
    may_snapshot: bool | None = None
    snapshot_due: float = -math.inf
    _open: deque[_Open] = attrs.field(factory=deque)
    _where: dict[int, _Open] = attrs.field(factory=dict)
    _marks: deque[tuple[int, int]] = attrs.field(factory=deque)  # (WAL position, xmin)

    def begin_cycle(self, confirmed: int) -> None:
        """A cycle reads again from the slot's confirmed position."""
        self.confirmed, self.read_upto, self.idle_upto = confirmed, 0, 0
        self._open.clear()
        self._where.clear()
        self._forget_below(confirmed)

    def marked(self, wal_position: int, xmin: int) -> None:
        """Before a peek: every transaction id below *xmin* had ended by *wal_position*;
        once the slot passes that position, they are all passed (:attr:`passed_xid`)."""
        if xmin and (not self._marks or xmin > self._marks[-1][1]):
            self._marks.append((wal_position, xmin))
            if len(self._marks) > MAX_MARKS:
                self._marks.popleft()
        self._promote()

    def _promote(self) -> None:
        while self._marks and self._marks[0][0] <= self.confirmed:
            self.passed_xid = max(self.passed_xid or 0, self._marks.popleft()[1])

    @property
    def open_events(self) -> int:
        """Events read in this cycle and not settled."""
        return sum(len(txn.pending) for txn in self._open)

    @property
    def unpassed_events(self) -> int:
        """Events read in this cycle that the slot has not passed: the next peek returns
        them again (it always starts at the confirmed position)."""
        return sum(txn.read for txn in self._open)

    def add(self, end_lsn: int, ids: Sequence[int], *, complete: bool = True) -> set[int]:
        """Events of a transaction read, in order (*complete*: its last ones; a large
        transaction comes in several pieces, and the slot passes none of it before the
        last); the ids of them already settled in an earlier cycle (not to be sent
        again)."""
        if complete:
            self.read_upto = max(self.read_upto, end_lsn)
        if ids:
            self.max_id = max(self.max_id, max(ids))
        done = self.settled.get(end_lsn, set())
        last = self._open[-1] if self._open else None
        if last is None or last.end_lsn != end_lsn or last.complete:
            last = _Open(end_lsn, set())
            self._open.append(last)
        new = {outbox_id for outbox_id in ids if outbox_id not in done}
        last.pending |= new
        last.read += len(ids)
        last.complete = complete
        for outbox_id in new:
            self._where[outbox_id] = last
        return done & set(ids)

    def settle(self, ids: Iterable[int]) -> None:
        for outbox_id in ids:
            txn = self._where.pop(outbox_id, None)
            if txn is not None:
                txn.pending.discard(outbox_id)
                self.settled.setdefault(txn.end_lsn, set()).add(outbox_id)

    def caught_up(self, wal_position: int) -> None:
        """A peek found nothing of the outbox up to *wal_position*."""
        self.idle_upto = max(self.idle_upto, wal_position)

    def passable(self) -> int | None:
        """The furthest position the slot may move to now (None: not past the confirmed
        one): the end of the last transaction of the settled prefix, or the idle mark
        when every transaction read is settled."""
        lsn = self.confirmed
        for txn in self._open:
            if txn.pending or not txn.complete:
                break
            lsn = txn.end_lsn
        else:
            lsn = max(lsn, self.idle_upto)
        return lsn if lsn > self.confirmed else None

    def passable_events(self) -> int:
        """How many events read in this cycle the slot would pass at :meth:`passable`."""
        passed = 0
        for txn in self._open:
            if txn.pending or not txn.complete:
                break
            passed += txn.read
        return passed

    def advanced(self, confirmed: int) -> None:
        """The slot's confirmed position is now *confirmed*."""
        self.confirmed = max(self.confirmed, confirmed)
        while self._open and self._open[0].end_lsn <= self.confirmed:
            self._open.popleft()
        self._forget_below(self.confirmed)
        self._promote()

    def _forget_below(self, lsn: int) -> None:
        for end_lsn in [end for end in self.settled if end <= lsn]:
            del self.settled[end_lsn]
