"""The relay's marker: every answer already queued goes in one transaction, and a soft
stop still marks what the publisher handed over."""

from __future__ import annotations

from typing import Any, cast

import attrs
import trio
import trio.testing

from actors.kafka.producer import KafkaProducer
from actors.outbox.cycle import CycleLedger, RelayCycle
from actors.outbox.marker import mark_answered, run_marker
from actors.outbox.messages import Answered, Failure
from actors.outbox.settings import OutboxRelayConfig
from actors.outbox.state import RelayState
from supervision.db.database import Database


@attrs.define
class RecordingDb:
    """A database that records each transaction's arguments; each takes *latency*."""

    latency: float = 0.0
    calls: list[tuple[Any, ...]] = attrs.field(factory=list)

    async def atomic(self, fn: Any, *args: Any) -> list[float]:
        assert fn is mark_answered
        await trio.sleep(self.latency)
        self.calls.append(args)
        return []  # no delivery time: nothing observed


def cycle_of(db: RecordingDb, unmarked: set[int]) -> RelayCycle:
    """A cycle whose ledger holds *unmarked* (the marker needs only the database and the
    ledger)."""
    ledger = CycleLedger.for_config(OutboxRelayConfig())
    ledger.unmarked.update(unmarked)
    return RelayCycle(cast(Database, db), OutboxRelayConfig(), cast(KafkaProducer, None),
                      RelayState(), deadline=float("inf"), max_row_bytes=1 << 20,
                      ledger=ledger)


def test_answers_queued_behind_one_are_recorded_in_one_transaction() -> None:
    """Three waves answered while the marker was busy: one transaction marks every
    acknowledged row and counts each failure; the marked ids leave the unmarked set."""
    cycle = cycle_of(db := RecordingDb(), {1, 2, 3, 4, 5})

    async def main() -> None:
        send, recv = trio.open_memory_channel[Answered](8)
        async with send:
            send.send_nowait(Answered([1, 2], []))
            send.send_nowait(Answered([3], [Failure(4, "t", "kafka:RequestTimedOutError")]))
            send.send_nowait(Answered([5], []))
        await run_marker(cycle, recv)

    trio.run(main)
    assert db.calls == [([1, 2, 3, 5], [Failure(4, "t", "kafka:RequestTimedOutError")])]
    assert (cycle.counts.published, cycle.counts.failed) == (4, 1)
    assert cycle.ledger.unmarked == {4}


def test_a_soft_stop_marks_every_answer_already_handed_over() -> None:
    """Cancelled while marking one wave with two more queued: the mark in flight
    completes, and the queued answers are marked too before the marker stops."""
    cycle = cycle_of(db := RecordingDb(latency=1.0), set(range(1, 4)))

    async def main() -> None:
        send, recv = trio.open_memory_channel[Answered](8)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run_marker, cycle, recv)
            await send.send(Answered([1], []))
            await trio.testing.wait_all_tasks_blocked()  # the marker is marking row 1
            await send.send(Answered([2], []))
            await send.send(Answered([3], []))
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert db.calls == [([1], []), ([2, 3], [])]
    assert cycle.counts.published == 3 and cycle.ledger.unmarked == set()
