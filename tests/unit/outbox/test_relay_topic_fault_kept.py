"""A topic fault the cycle never looked for is not forgotten because its retry came due
before the cycle ended (the publisher over a fake producer, on trio's MockClock).

The bad-input case ``kafka-missing-topic`` failed once under load with no fault in
readiness and the run's counts ``{"published": 3}``: its second ``run-once`` cycle claimed
nothing (the topic was still held by its back-off, full jitter within 0.25 s), its retry
came due while that cycle was ending, and the end of the cycle forgot the fault as settled
(no row of the topic in its claims). The relay then reported a clean drain and cleared
readiness. The fault is now judged as of the cycle's empty claim (when the topic was left
out), which this test pins: it fails when the publisher judges as of the cycle's end.
Forced this way (a late end of a cycle that claimed nothing), the old judgement failed the
case on its first run; the present one passed it 60 times in a row.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import cast

import trio
import trio.testing

from actors.kafka.producer import Delivery, KafkaProducer, OutMessage, SendResult
from actors.outbox.messages import Answered, Claim, DeadLetter
from actors.outbox.publisher import run_publisher
from actors.outbox.rows import Malformed, Row
from actors.outbox.state import RelayState
from actors.outbox.window import InHand, Window

BROKER_S = 0.5  # the healthy topic's round trip: the cycle ends this late
MISSING = "badinput.missing"


class SlowProducer:
    """Acknowledges every message after BROKER_S."""

    async def send_wave(self, messages: Sequence[OutMessage]) -> list[SendResult]:
        await trio.sleep(BROKER_S)
        return [SendResult(m.outbox_id, Delivery.ACKED) for m in messages]


def row(outbox_id: int, topic: str, key: str) -> Row:
    return Row(outbox_id, topic, key, OutMessage(outbox_id, topic, key.encode(), b"x", ()))


async def cycle(state: RelayState, claims: list[Claim]) -> float:
    """One publisher run over *claims* (handed over at once, as a claimer that ran ahead);
    the trio time it ended."""
    in_hand = InHand(max_rows=100, max_bytes=1_000_000)
    claims_send, claims_recv = trio.open_memory_channel[Claim](math.inf)
    answers_send, _answers = trio.open_memory_channel[Answered](math.inf)
    letters_send, _letters = trio.open_memory_channel[DeadLetter](math.inf)
    for claim in claims:
        in_hand.add([r for r in claim.rows if isinstance(r, Row)])
        claims_send.send_nowait(claim)
    claims_send.close()
    await run_publisher(cast(KafkaProducer, SlowProducer()), state, Window(in_hand),
                        math.inf, claims_recv, answers_send, letters_send)
    return trio.current_time()


async def test_a_held_topic_keeps_its_fault_when_its_retry_comes_due_before_the_cycle_ends(
        autojump_clock: trio.testing.MockClock) -> None:
    """The missing topic's retry is due 0.25 s after its fault; the cycle's claims (made
    at once, the topic still held) return only a healthy row and then nothing; the
    healthy row's wave takes 0.5 s. The fault outlives the cycle, and readiness still
    names the topic."""
    state = RelayState()
    fault = state.topic_failed(MISSING, "kafka:UnknownTopicOrPartitionError", now=0.0)
    assert 0.0 <= fault.retry_at <= 0.25
    rows: list[Row | Malformed] = [row(1, "healthy", "a")]
    ended = await cycle(state, [Claim(rows, 1, at=0.0), Claim([], 0, at=0.0)])
    assert ended > fault.retry_at  # the retry came due while the cycle went on
    assert set(state.topic_faults) == {MISSING}
    assert state.fault_reason() == f"topic {MISSING}: kafka:UnknownTopicOrPartitionError"


async def test_a_topic_due_at_the_empty_claim_and_without_rows_is_forgotten(
        autojump_clock: trio.testing.MockClock) -> None:
    """The control: a fault already due when the cycle's claim came back without a row
    of its topic is settled (its rows are gone: published elsewhere or dead-lettered)."""
    state = RelayState()
    fault = state.topic_failed(MISSING, "kafka:UnknownTopicOrPartitionError", now=0.0)
    await trio.sleep_until(fault.retry_at)
    now = trio.current_time()
    await cycle(state, [Claim([row(1, "healthy", "a")], 1, at=now), Claim([], 0, at=now)])
    assert state.topic_faults == {}
    assert state.fault_reason() is None
