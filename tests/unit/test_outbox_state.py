"""The relay's memory stays bounded by what is pending."""

from __future__ import annotations

from actors.outbox.state import RelayState, RowRetries


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
    """The n-th fault of a topic waits longer (capped) before the topic is tried again."""
    state = RelayState()
    first = state.topic_failed("t", "x", now=0.0)
    for _ in range(8):
        last = state.topic_failed("t", "x", now=0.0)
    assert last.failures == 9 and first.retry_at <= 0.25 < last.retry_at <= 30.0
