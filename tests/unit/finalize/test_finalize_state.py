"""The per-cycle state of recording-finalize: the outage breaker."""

from __future__ import annotations

from actors.finalize.state import Breaker


def test_breaker_opens_after_threshold_consecutive_transient_outcomes() -> None:
    """Four transient HEADs in a row keep it closed; the fifth opens it."""
    breaker = Breaker(threshold=5)
    for _ in range(4):
        breaker.record(transient=True)
    assert not breaker.open
    breaker.record(transient=True)
    assert breaker.open and breaker.fault is None


def test_a_successful_head_resets_the_transient_streak() -> None:
    """Transient outcomes separated by successes never open the breaker."""
    breaker = Breaker(threshold=3)
    for _ in range(10):
        breaker.record(transient=True)
        breaker.record(transient=True)
        breaker.record(transient=False)
    assert not breaker.open and breaker.consecutive_transient == 0


def test_a_fault_opens_the_breaker_and_names_itself() -> None:
    """A configuration fault opens it at once and is remembered for readiness."""
    breaker = Breaker(threshold=5)
    breaker.trip("bucket_missing")
    assert breaker.open and breaker.fault == "bucket_missing"


def test_one_transient_head_makes_the_cycle_unhealthy_even_with_the_breaker_closed() -> None:
    """The self-healing quarantine waits for cycles with no transient HEAD at all: a
    single one (the breaker still closed) is enough to call the cycle unhealthy."""
    breaker = Breaker(threshold=5)
    breaker.record(transient=False)
    assert breaker.healthy
    breaker.record(transient=True)
    breaker.record(transient=False)
    assert not breaker.open and not breaker.healthy
    faulted = Breaker(threshold=5)
    faulted.trip("bucket_missing")
    assert not faulted.healthy
