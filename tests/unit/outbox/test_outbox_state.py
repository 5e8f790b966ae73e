"""The relay's memory stays bounded by what is pending; its waits come from the one
back-off policy (full jitter, capped)."""

from __future__ import annotations

import statistics

from actors.outbox.state import RELAY_BACKOFF, RelayState, RowRetries


def test_row_back_off_grows_with_failures_and_is_forgotten_on_ack() -> None:
    """Each failure pushes the row's due time; an acknowledged row leaves no trace."""
    retries = RowRetries()
    retries.failed(1, now=100.0, delay=1.0)
    assert retries.due_at(1) == 101.0
    assert retries.failed(1, now=101.0) == 2
    retries.forget(1)
    assert len(retries) == 0 and retries.due_at(1) == 0.0


def test_rows_no_longer_pending_are_forgotten_at_the_next_claim() -> None:
    """Rows dead-lettered or published by another relay never come back in a claim:
    their back-off is dropped, whatever their number; a still pending row keeps it."""
    state = RelayState()
    for outbox_id in range(10_000):
        state.rows.failed(outbox_id, now=0.0, delay=5.0)
    state.forget_settled({42, 10_001}, {"t"}, now=1.0)
    assert len(state.rows) == 1
    assert state.rows.due_at(42) == 5.0


def test_topic_fault_is_kept_while_held_and_dropped_when_due_without_rows() -> None:
    """A faulted topic stays (readiness 503) until its retry is due; then, with no row of
    it left to try, the fault is forgotten; a topic with rows keeps it until an ack."""
    state = RelayState()
    fault = state.topic_failed("gone", "kafka:UnknownTopicOrPartitionError", now=0.0)
    state.topic_failed("busy", "kafka:TopicAuthorizationFailedError", now=0.0)
    assert state.held_topics(0.0) == ["busy", "gone"]
    state.forget_settled(set(), set(), now=0.0)
    assert set(state.topic_faults) == {"busy", "gone"}
    later = fault.retry_at + 31.0
    assert state.held_topics(later) == []
    state.forget_settled({1}, {"busy"}, now=later)
    assert set(state.topic_faults) == {"busy"}
    assert state.fault_reason() == "topic busy: kafka:TopicAuthorizationFailedError"


def test_repeated_topic_faults_back_off_longer() -> None:
    """The n-th fault of a topic waits longer (capped at 30 s) before the topic is tried
    again: the first waits within 0.25 s, the ninth anywhere up to 30 s (full jitter)."""
    firsts, ninths = [], []
    for _ in range(200):
        state = RelayState()
        firsts.append(state.topic_failed("t", "x", now=0.0).retry_at)
        for _ in range(8):
            last = state.topic_failed("t", "x", now=0.0)
        assert last.failures == 9
        ninths.append(last.retry_at)
    assert max(firsts) <= 0.25 and max(ninths) <= 30.0
    assert statistics.mean(ninths) > 10.0 > 0.25 > statistics.mean(firsts)


def test_row_back_off_draws_from_the_relay_policy_with_full_jitter() -> None:
    """Without an explicit delay, the n-th failure of a row waits a time drawn from
    ``[0, RELAY_BACKOFF.ceiling(n - 1)]``: spread over the whole window, not a fixed step."""
    waits = []
    for outbox_id in range(500):
        retries = RowRetries()
        for _ in range(3):
            retries.failed(outbox_id, now=0.0)
        waits.append(retries.due_at(outbox_id))
    ceiling = RELAY_BACKOFF.ceiling(2)
    assert ceiling == 1.0
    assert all(0.0 <= wait <= ceiling for wait in waits)
    assert min(waits) < 0.1 * ceiling and max(waits) > 0.9 * ceiling


def test_kafka_failures_grow_the_kafka_wide_wait_up_to_the_cap() -> None:
    """Each consecutive Kafka failure counts, and the next try is due after a wait within
    the policy's window for that count (never past 30 s)."""
    state = RelayState()
    for n in range(1, 15):
        delay = state.kafka_failed(now=100.0)
        assert state.kafka_failures == n
        assert state.kafka_retry_at == 100.0 + delay
        assert 0.0 <= delay <= RELAY_BACKOFF.ceiling(n - 1) <= 30.0
    assert RELAY_BACKOFF.ceiling(13) == 30.0
