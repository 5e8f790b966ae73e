"""The stream's confirmation when the server has ended the stream (no server: a stand-in
for libpq's connection)."""

from __future__ import annotations

import attrs
from psycopg import pq

from actors.outbox.logical_setup import LogicalSource
from actors.outbox.stream import SlotStream


@attrs.define
class EndedConnection:
    """A replication connection whose server went away: nothing can be sent."""

    status: pq.ConnStatus = pq.ConnStatus.OK
    error_message: bytes = b"server closed the connection unexpectedly"

    def put_copy_data(self, data: bytes) -> int:
        return -1

    def flush(self) -> int:
        return -1

    def finish(self) -> None:
        self.status = pq.ConnStatus.BAD


async def test_a_confirmation_the_server_cannot_take_closes_the_stream_and_moves_nothing(
) -> None:
    """(Async only because a stream reads Trio's clock when it is made.)"""
    conn = EndedConnection()
    stream = SlotStream(conn, LogicalSource("slot", "publication"))  # type: ignore[arg-type]
    stream.confirm(1000)
    assert stream.closed
    assert stream.confirmed == 0, "the slot did not move: the next cycle reads again"
    stream.confirm(2000)  # a closed stream is told nothing more
    assert stream.confirmed == 0
