"""The logical source's stream: the slot's changes as PostgreSQL's walsender sends them.

>>> stream = await SlotStream.open(dsn, source)       # START_REPLICATION … LOGICAL
>>> records = await stream.read(upto_n, idle=0.5)    # [(lsn, pgoutput bytes), ...]
>>> stream.confirm(lsn)                              # after the lease's fence is checked
>>> stream.close()

A peek (:mod:`actors.outbox.slot_io`) starts a new decoding of the WAL at every call, from
the slot's restart position, and returns again every event above its confirmed position;
a stream decodes each change once, as it is committed, and sends it at once. Measured on
the test server at 2,000 single-row commits a second: commit to receipt p50 0.2 to 0.3 ms and
p99 5 to 15 ms against 43 to 92 and 146 to 223 ms for a loop of peeks, and a third of the
PostgreSQL CPU (docs/benchmarks.md).

The connection is a libpq replication connection (``replication=database``) driven
through psycopg's own libpq wrapper (:mod:`psycopg.pq`: psycopg 3 has no replication
client, and a second driver for one COPY BOTH loop would bring its own libpq): Trio waits
for the socket, nothing blocks. The replication protocol's three messages ("Streaming
Replication Protocol" in the PostgreSQL manual) are parsed and built here with
:mod:`struct`: XLogData (``w``: the change's LSN, then the pgoutput message), the
primary's keepalive (``k``: answered at once when the server asks) and the standby status
update (``r``: the position the relay confirms — the slot's confirmed position moves
there, and never before :meth:`SlotStream.confirm` says so).

A slot streams to one connection at a time: while a stream is open, the slot is *active*
and neither a peek nor ``pg_replication_slot_advance`` may use it (the relay moves it by
:meth:`SlotStream.confirm`), and a second relay's ``START_REPLICATION`` is refused (an
:class:`InfrastructureError` for its cycle). Closing the connection frees the slot.
"""

from __future__ import annotations

import math
import struct
import time
from typing import Any

import psycopg
import trio
from psycopg import pq
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from actors.outbox.logical_setup import LogicalSource
from actors.outbox.slot_io import SlotGone
from supervision.errors import InfrastructureError

__all__ = ["SlotStream", "replication_conninfo"]

_XLOG = struct.Struct("!qqq")  # data start, WAL end, send time
_KEEPALIVE = struct.Struct("!qqB")  # WAL end, send time, reply requested
_STATUS = struct.Struct("!cqqqqB")  # 'r', written, flushed, applied, client time, reply
PG_EPOCH_US = 946_684_800_000_000  # 2000-01-01 in µs since the Unix epoch
BUSY_WAIT = 2.0  # nothing from a walsender still catching up, before a read gives up
GATHER_WAIT = 0.002  # behind a backlog, how long a read waits for more before it returns
IN_USE_WAIT = 2.0  # how long a slot in use is waited for before the cycle gives up
IN_USE_POLL = 0.02


class SlotInUse(InfrastructureError):
    """Another session streams the slot (START_REPLICATION refused)."""


def replication_conninfo(dsn: str) -> str:
    """*dsn* (a daemon connection's, :func:`supervision.db.pgconn.conninfo`) as a logical
    replication connection: ``replication=database``, no statement timeout (the stream
    is one long command)."""
    params: dict[str, Any] = conninfo_to_dict(dsn)
    options = " ".join(o for o in (params.pop("options", ""), "-c statement_timeout=0") if o)
    return make_conninfo("", **{**params, "replication": "database", "options": options,
                                "application_name": "safetynet-outbox-stream"})


class SlotStream:
    """One open stream of the slot's changes (pgoutput, protocol version 1)."""

    def __init__(self, conn: pq.abc.PGconn, source: LogicalSource) -> None:
        self._conn, self.source = conn, source
        self.confirmed = 0  # the position last confirmed to the server
        self.received = 0  # the LSN of the last change received
        self.caught_up = 0  # the server sent everything before it (its keepalive's WAL end)
        self._pending: list[tuple[int, bytes]] = []  # received, not handed out yet
        self._closed = 0  # how many of them end with a Commit
        self._changed_at = -math.inf  # when the last change was seen (Trio's clock)
        self._opened_at = trio.current_time()
        self._fresh = False  # a change came since the clock was last read

    @classmethod
    async def open(cls, dsn: str, source: LogicalSource) -> SlotStream:
        """Connect and start streaming from the slot's confirmed position. A missing slot
        is :class:`SlotGone`; a refused connection or a slot in use by another session an
        :class:`InfrastructureError`."""
        conninfo = replication_conninfo(dsn)
        with trio.move_on_after(IN_USE_WAIT):
            while True:
                try:
                    conn = await trio.to_thread.run_sync(_start, conninfo, source)
                except SlotInUse:
                    await trio.sleep(IN_USE_POLL)  # a walsender of ours still leaving
                    continue
                return cls(conn, source)
        raise InfrastructureError(f"postgres: replication slot {source.slot} is in use by "
                                  "another session")

    async def read(self, upto_n: int, idle: float, until: int = 0,
                   enough: int = 1) -> list[tuple[int, bytes]]:
        """The changes of the whole transactions received: once about *upto_n* changes
        have come; or as soon as nothing more has come in and at least one transaction
        is whole — while the server is still sending a backlog (it has not said it
        caught up), at least *enough* changes, or whatever is whole after
        :data:`GATHER_WAIT` with nothing more; or once nothing has come for *idle*
        seconds since the last change (or since the stream opened, without *until*;
        then maybe none). While the server has not said it sent everything up to the
        WAL position *until* (:meth:`caught_up_to`), nothing for up to
        :data:`BUSY_WAIT` is not idle: it is still decoding (a large transaction comes
        whole, after its commit); nor is it after a change until the server's next
        keepalive (it sends one each time it has caught up).
        The changes of a transaction not closed yet wait for the next read."""
        while True:
            message = self._next()
            if message is None:
                self._consume()  # what the socket holds already
                message = self._next()
            if message is not None:
                self._pending.append(message)
                if message[1][:1] == b"C":
                    self._closed = len(self._pending)
                    if self._closed >= upto_n:
                        return self._take()
                continue
            if self._closed:
                if self._closed >= enough or self.caught_up >= max(until, self.received):
                    return self._take()
                # a backlog still coming in: a little more, rather than a claim of a few
                with trio.move_on_after(GATHER_WAIT) as gathered:
                    await trio.lowlevel.wait_readable(self._conn.socket)
                if gathered.cancelled_caught:
                    return self._take()
                self._consume()
                continue
            now = trio.current_time()
            if self._fresh:
                self._changed_at, self._fresh = now, False
            # quiet only once the walsender said it sent everything (its keepalive) past
            # what came last and past *until*; before that it is busy decoding. With no
            # *until*, the stream's start counts as a change (the first keepalive may
            # come before the first change)
            since = self._changed_at if until else max(self._changed_at, self._opened_at)
            wait = since + idle - now if self.caught_up_to(until) else BUSY_WAIT
            if wait <= 0:
                return []
            with trio.move_on_after(wait) as waited:
                await trio.lowlevel.wait_readable(self._conn.socket)
            if waited.cancelled_caught:
                return self._take()
            self._consume()

    def caught_up_to(self, until: int) -> bool:
        """The server said (its keepalive) it sent everything before a WAL position past
        *until* and past the last change received, and no transaction is half received:
        every outbox event committed before :attr:`caught_up` has come."""
        return (self.caught_up > 0 and self.caught_up >= max(until, self.received)
                and not self._pending)

    def _take(self) -> list[tuple[int, bytes]]:
        if self._fresh:
            self._changed_at, self._fresh = trio.current_time(), False
        taken, self._pending = self._pending[:self._closed], self._pending[self._closed:]
        self._closed = 0
        return taken

    def confirm(self, lsn: int) -> None:
        """Tell the server the relay is done with everything before *lsn*: the slot's
        confirmed position moves there (only ever forward; nothing once closed). The
        caller checks the lease's fence first: a fenced leader never confirms. A stream
        the server has ended meanwhile (its ``wal_sender_timeout`` while the cycle's last
        waves were out) is closed instead, and the slot stays where it was: the next
        cycle reads those events again (at least once)."""
        if lsn > self.confirmed and not self.closed:
            previous, self.confirmed = self.confirmed, lsn
            try:
                self._status(reply=False)
            except InfrastructureError:
                self.confirmed = previous
                self._conn.finish()

    @property
    def closed(self) -> bool:
        return self._conn.status != pq.ConnStatus.OK

    def close(self) -> None:
        """End the stream (the server frees the slot once its walsender has gone); what
        was confirmed was sent first."""
        self._conn.finish()

    def _next(self) -> tuple[int, bytes] | None:
        """The next change already received, answering keepalives on the way."""
        while True:
            size, data = self._conn.get_copy_data(1)
            if size == 0:
                return None
            if size < 0:
                raise self._ended()
            raw = bytes(data)
            if raw[:1] == b"w":
                start = _XLOG.unpack_from(raw, 1)[0]
                self.received, self._fresh = start, True
                return start, raw[1 + _XLOG.size:]
            if raw[:1] == b"k":  # answered always: our written position follows it, so a
                # caught-up walsender sends one keepalive, not one per wake-up
                wal_end = _KEEPALIVE.unpack_from(raw, 1)[0]
                self.caught_up = max(self.caught_up, wal_end)
                self._status(reply=False)

    def _consume(self) -> None:
        try:
            self._conn.consume_input()
        except psycopg.OperationalError as exc:
            raise self._ended() from exc

    def _status(self, reply: bool) -> None:
        now = int(time.time() * 1_000_000) - PG_EPOCH_US
        written = max(self.received, self.confirmed, self.caught_up)
        message = _STATUS.pack(b"r", written, self.confirmed, self.confirmed, now, reply)
        if self._conn.put_copy_data(message) != 1 or self._conn.flush() != 0:
            raise self._ended()

    def _ended(self) -> InfrastructureError:
        error = self._conn.error_message.decode(errors="replace").strip()
        return InfrastructureError(f"postgres: the stream of replication slot "
                                   f"{self.source.slot} ended: {error or 'closed'}")


def _start(conninfo: str, source: LogicalSource) -> pq.abc.PGconn:
    """Connect and send START_REPLICATION (in a worker thread: libpq's connect blocks)."""
    conn = pq.PGconn.connect(conninfo.encode())
    if conn.status != pq.ConnStatus.OK:
        error = conn.error_message.decode(errors="replace").strip()
        conn.finish()
        raise InfrastructureError(f"postgres: stream of replication slot {source.slot}: "
                                  f"{error.splitlines()[0] if error else 'no connection'}")
    command = (f"START_REPLICATION SLOT {psycopg.sql.Identifier(source.slot).as_string()}"
               f" LOGICAL 0/0 (proto_version '1', publication_names "
               f"{psycopg.sql.Literal(source.publication).as_string()})")
    conn.send_query(command.encode())
    result = conn.get_result()
    if result is None or result.status != pq.ExecStatus.COPY_BOTH:
        error = (result.error_message if result is not None else conn.error_message
                 ).decode(errors="replace").strip()
        state = result.error_field(pq.DiagnosticField.SQLSTATE) if result else None
        conn.finish()
        first = error.splitlines()[0] if error else "START_REPLICATION refused"
        if state == b"55006":  # object_in_use: another walsender has it
            raise SlotInUse(first)
        if state == b"42704":  # undefined_object: the slot does not exist
            raise SlotGone(f"postgres: replication slot {source.slot} does not exist "
                           "(safetynet migrate creates it)")
        raise InfrastructureError(f"postgres: stream of replication slot {source.slot}: "
                                  f"{first}")
    conn.nonblocking = 1
    return conn
