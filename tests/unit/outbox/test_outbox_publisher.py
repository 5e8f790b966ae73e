"""The publisher's waves over a fake producer: behind a backlog, a small wave waits (a
bounded time) for the claim in flight; caught up, every wave goes at once."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import cast

import trio
import trio.testing

from actors.kafka.producer import Delivery, KafkaProducer, OutMessage, SendResult
from actors.outbox.messages import Answered, Claim, DeadLetter
from actors.outbox.publisher import COALESCE_WAIT, run_publisher
from actors.outbox.rows import Malformed, Row
from actors.outbox.state import RelayState
from actors.outbox.window import InHand, Window


class RecordingProducer:
    """Acknowledges every message; records each wave's ids and when it was sent."""

    def __init__(self) -> None:
        self.waves: list[list[int]] = []
        self.sent_at: list[float] = []

    async def send_wave(self, messages: Sequence[OutMessage]) -> list[SendResult]:
        self.waves.append([m.outbox_id for m in messages])
        self.sent_at.append(trio.current_time())
        await trio.sleep(0.001)  # the broker's round trip
        return [SendResult(m.outbox_id, Delivery.ACKED) for m in messages]


def row(outbox_id: int, key: str) -> Row:
    return Row(outbox_id, "t", key, OutMessage(outbox_id, "t", key.encode(), b"x", ()))


async def publish(claims: list[tuple[float, Claim]], min_wave: int) -> RecordingProducer:
    """Run the publisher over *claims*, each handed over after its delay (as a claimer
    would: its rows counted in hand first); the producer's record once it ends."""
    producer = RecordingProducer()
    in_hand = InHand(max_rows=100, max_bytes=1_000_000)
    claims_send, claims_recv = trio.open_memory_channel[Claim](0)
    answers_send, answers_recv = trio.open_memory_channel[Answered](math.inf)
    letters_send, _letters_recv = trio.open_memory_channel[DeadLetter](math.inf)

    async def claimer() -> None:
        async with claims_send:
            for delay, claim in claims:
                await trio.sleep(delay)
                in_hand.add([r for r in claim.rows if isinstance(r, Row)])
                await claims_send.send(claim)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(claimer)
        await run_publisher(cast(KafkaProducer, producer), RelayState(), Window(in_hand),
                            math.inf, claims_recv, answers_send, letters_send,
                            min_wave=min_wave)
    assert sorted(_drain(answers_recv)) == sorted(i for wave in producer.waves for i in wave)
    return producer


def _drain(answers: trio.MemoryReceiveChannel[Answered]) -> list[int]:
    acked: list[int] = []
    while True:
        try:
            acked.extend(answers.receive_nowait().acked)
        except (trio.WouldBlock, trio.EndOfChannel):
            return acked


FIRST: list[Row | Malformed] = [row(1, "a"), row(2, "b"), row(3, "c"), row(4, "a")]  # key a twice
SECOND: list[Row | Malformed] = [row(5, "d"), row(6, "e")]


def test_behind_a_backlog_a_small_wave_waits_for_the_claim_in_flight() -> None:
    """The first claim was full (behind): after its first wave, the one row left (key a
    again) is not sent alone; it goes with the next claim's rows, still after row 1."""
    claims = [(0.0, Claim(FIRST, 4, behind=True)), (0.01, Claim(SECOND, 2)),
              (0.0, Claim([], 0))]
    producer = trio.run(publish, claims, 3, clock=trio.testing.MockClock(autojump_threshold=0))
    assert producer.waves == [[1, 2, 3], [4, 5, 6]]


def test_caught_up_every_wave_goes_at_once() -> None:
    """The same rows, the first claim short (caught up): row 4 goes alone at once, the
    next claim's rows in a wave of their own."""
    claims = [(0.0, Claim(FIRST, 4)), (0.01, Claim(SECOND, 2)), (0.0, Claim([], 0))]
    producer = trio.run(publish, claims, 3, clock=trio.testing.MockClock(autojump_threshold=0))
    assert producer.waves == [[1, 2, 3], [4], [5, 6]]
    assert producer.sent_at[1] < 0.01


def test_a_small_wave_waits_no_longer_than_the_bound() -> None:
    """Behind a backlog but the next claim is slow: the small wave goes after
    COALESCE_WAIT, not when the claim lands."""
    claims = [(0.0, Claim(FIRST, 4, behind=True)), (1.0, Claim(SECOND, 2)),
              (0.0, Claim([], 0))]
    producer = trio.run(publish, claims, 3, clock=trio.testing.MockClock(autojump_threshold=0))
    assert producer.waves == [[1, 2, 3], [4], [5, 6]]
    assert COALESCE_WAIT <= producer.sent_at[1] < 1.0
