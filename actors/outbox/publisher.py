"""The outbox publisher: sends claimed rows to Kafka in per-key waves and sorts the answers.

Inputs: :class:`~actors.outbox.messages.Claim` messages (receive channel) from the claimer,
the producer, the relay's state. Outputs: Kafka messages with the SPEC §4 headers; per
wave, the acknowledged ids and the transient failures to the marker
(:class:`~actors.outbox.messages.Answered`); malformed and permanently rejected rows to
the dead letters (:class:`~actors.outbox.messages.DeadLetter`); the relay's memory (row,
topic and Kafka-wide back-off) and readiness. Restart type: none — it lives for one cycle.

A wave is formed only after the previous one was answered, from every claimed row not yet
sent (:class:`~actors.outbox.window.Window`, fed by every claim the claimer has ready), at
most one row per key, so a later row of a key is never sent before an earlier one was
acknowledged; one crossing to aiokafka per wave (:meth:`KafkaProducer.send_wave`). Behind
a backlog (the last claim was full), a wave that would hold fewer than a quarter of
``batch_size`` keys first waits up to :data:`COALESCE_WAIT` for the claim in flight, so a
drain goes out in large waves, not in a trickle of each claim's repeated keys. A key
with a row not acknowledged in this cycle is held for the rest of it: a transient failure
(the row and every later row of its key wait for the row's back-off), a dead letter (the
dead letters decide whether it blocks the key for good), a row still in its back-off.
When the broker refuses *us* for a topic (authorization, a topic that does not exist), no
row is charged: the topic's rows leave the window and the claims, readiness is 503
(``safetynet_config_fault{component="kafka"}``) and the topic is tried again after its
back-off. A wave that failed whole (Kafka unreachable) ends the cycle with the Kafka-wide
back-off; readiness stays 200 and the oldest unpublished age grows.

It ends when the claimer has caught up and the window is empty — then the back-off of
every row and topic no claim of the cycle returned is forgotten — or at the cycle's
``max_run_duration`` (the back-off of unclaimed rows is kept). Closing its channels ends
the marker and the dead letters once they have drained.

What cancellation does: a wave in flight is abandoned un-marked; those rows are sent
again later with the same ``event-id`` (at least once).
"""

from __future__ import annotations

import math

import structlog
import trio

from actors.kafka.producer import Delivery, KafkaProducer
from actors.outbox.cycle import RelayCycle
from actors.outbox.messages import Answered, Claim, DeadLetter, Failure
from actors.outbox.metrics import OUTBOX_PUBLISH_FAILED
from actors.outbox.rows import Row
from actors.outbox.state import RelayState
from actors.outbox.window import Window
from supervision.errors import ConfigurationFault
from supervision.tree.health import HEALTH

log = structlog.get_logger("outbox_relay")

# Behind a backlog, how long a small wave waits for the claim in flight (about one claim's
# time under load): a drain of 20,000 rows then goes out in ~75 waves instead of ~140,
# and each wave saved is a broker round trip and a crossing that no longer competes with
# the claim for the GIL (docs/benchmarks.md). Caught up, no wave waits.
COALESCE_WAIT = 0.05


async def connect(producer: KafkaProducer, state: RelayState) -> bool:
    """Start the producer if it is not yet (unless the Kafka-wide back-off is running);
    True when it is started. A refused connection is a configuration fault, an
    unreachable broker a back-off: never a crash loop."""
    if trio.current_time() < state.kafka_retry_at:
        return False
    if producer.started:
        return True
    try:
        await producer.start()
    except ConfigurationFault as exc:  # TLS or SASL refused: the operator must act
        _connection_fault(state, str(exc))
        return False
    except Exception as exc:  # broker unreachable: back off, never crash-loop
        # a refusal seen before stays until a connection succeeds (no flapping)
        _kafka_down(state, type(exc).__name__)
        return False
    state.connection_fault, state.kafka_failures = None, 0
    return True


async def run_publisher(producer: KafkaProducer, state: RelayState, window: Window,
                        deadline: float, claims: trio.MemoryReceiveChannel[Claim],
                        answers: trio.MemorySendChannel[Answered],
                        dead_letters: trio.MemorySendChannel[DeadLetter],
                        min_wave: int = 1) -> None:
    """Send waves until the claims are drained, the *deadline*, or Kafka is down. Behind a
    backlog, a wave of fewer than *min_wave* keys waits up to :data:`COALESCE_WAIT` for
    the claim in flight."""
    caught_up_at: float | None = None  # when the claim that came back empty was made
    ended = behind = False
    async with claims, answers, dead_letters:
        while trio.current_time() < deadline:
            # nothing in hand: wait for a claim; else take every claim that is ready, and
            # behind a backlog, let a small wave wait a little for the claim in flight
            while not ended:
                if not window.rows:
                    wait = math.inf
                elif (behind and window.in_hand.has_room()
                      and window.keys_fewer_than(min_wave)):
                    wait = COALESCE_WAIT
                else:
                    wait = 0.0
                try:
                    claim = await _next_claim(claims, wait)
                except trio.EndOfChannel:
                    ended = True
                    break
                if claim is None:
                    break
                behind = claim.behind
                if not claim.rows and caught_up_at is None:
                    caught_up_at = claim.at
                for letter in window.take(claim):
                    await dead_letters.send(letter)
            wave = window.next_wave(trio.current_time(), state.rows.due_at)
            if wave:
                if not await _send(producer, state, window, wave, answers, dead_letters):
                    return
            elif ended:
                if caught_up_at is not None:  # every row pending was seen
                    # as of that claim: a fault that came due after it was not looked for
                    state.forget_settled(window.seen_ids, window.seen_topics, caught_up_at)
                return


async def run_cycle_publisher(cycle: RelayCycle, window: Window,
                              claims: trio.MemoryReceiveChannel[Claim],
                              answers: trio.MemorySendChannel[Answered],
                              dead_letters: trio.MemorySendChannel[DeadLetter]) -> None:
    """The table source's publisher: :func:`run_publisher` with the cycle's producer,
    relay state, deadline and minimum wave."""
    await run_publisher(cycle.producer, cycle.state, window, cycle.deadline, claims,
                        answers, dead_letters, min_wave=cycle.min_wave)


async def _next_claim(claims: trio.MemoryReceiveChannel[Claim], wait: float) -> Claim | None:
    """The next claim, waiting for it up to *wait* seconds (``math.inf``: until it comes);
    None if none came in time. Raises :class:`trio.EndOfChannel` once the claimer is done."""
    if wait <= 0:
        try:
            return claims.receive_nowait()
        except trio.WouldBlock:
            return None
    with trio.move_on_after(wait):
        return await claims.receive()
    return None


async def _send(producer: KafkaProducer, state: RelayState, window: Window, wave: list[Row],
                answers: trio.MemorySendChannel[Answered],
                dead_letters: trio.MemorySendChannel[DeadLetter]) -> bool:
    """Send one wave and hand its answers on; False when Kafka looks down."""
    results = await producer.send_wave([row.message for row in wave])
    by_id = {row.id: row for row in wave}
    acked: list[int] = []
    failed: list[Failure] = []
    transient: str | None = None
    for result in results:
        row = by_id[result.outbox_id]
        if result.delivery is Delivery.ACKED:
            acked.append(row.id)
            state.rows.forget(row.id)
            state.topic_faults.pop(row.topic, None)
        elif result.delivery is Delivery.FAULT:
            if window.fault(row.topic):
                _topic_fault(state, row.topic, result.error or "refused")
        elif result.delivery is Delivery.REJECTED:
            window.hold(row)
            OUTBOX_PUBLISH_FAILED.labels(kind="permanent").inc()
            await dead_letters.send(DeadLetter(row.id, row.topic, row.message_key,
                                               f"kafka:{result.error}"))
        else:  # transient: the row and its key wait for the row's back-off
            window.hold(row)
            OUTBOX_PUBLISH_FAILED.labels(kind="transient").inc()
            state.rows.failed(row.id, trio.current_time())
            failed.append(Failure(row.id, row.topic, f"kafka:{result.error}"))
            transient = transient or result.error or "send failed"
    if acked or failed:
        await answers.send(Answered(acked, failed))
    if transient and not acked:
        _kafka_down(state, transient)
        return False
    state.kafka_failures = 0
    return True


def report_health(state: RelayState) -> None:
    """Readiness from the relay's memory: a refused connection or faulted topics."""
    reason = state.fault_reason()
    if reason is None:
        HEALTH.clear_fault("kafka")
    else:
        HEALTH.set_fault("kafka", reason)


def _topic_fault(state: RelayState, topic: str, error: str) -> None:
    """The broker refuses us for *topic*: its rows wait untouched, readiness is 503."""
    fault = state.topic_failed(topic, f"kafka:{error}", trio.current_time())
    HEALTH.set_fault("kafka", state.fault_reason() or fault.reason)
    log.error("config_fault", component="kafka", topic=topic, error=fault.reason,
              retry_in_s=round(fault.retry_at - trio.current_time(), 2))


def _connection_fault(state: RelayState, reason: str) -> None:
    """The broker refuses the connection: every row waits untouched, readiness is 503;
    the connection is tried again with the Kafka-wide back-off."""
    state.connection_fault = reason
    delay = state.kafka_failed(trio.current_time())
    HEALTH.set_fault("kafka", reason)
    log.error("config_fault", component="kafka", error=reason, retry_in_s=round(delay, 2))


def _kafka_down(state: RelayState, error: str) -> None:
    delay = state.kafka_failed(trio.current_time())
    log.warning("kafka_unavailable", error=error, failures=state.kafka_failures,
                retry_in_s=round(delay, 2))
