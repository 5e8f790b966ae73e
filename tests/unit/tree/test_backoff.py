"""The one back-off policy: full jitter over a capped exponential window."""

from __future__ import annotations

import random

import pytest

from supervision.tree.backoff import Backoff

SAMPLES = 20_000


def draws(policy: Backoff, failures: int, seed: int = 7) -> list[float]:
    random.seed(seed)
    return [policy.delay(failures) for _ in range(SAMPLES)]


@pytest.mark.parametrize("failures", [0, 1, 3, 5])
def test_full_jitter_is_uniform_over_the_whole_window(failures: int) -> None:
    """Each tenth of ``[0, ceiling]`` gets a tenth of the draws (chi-square, 9 degrees of
    freedom, p = 0.001), so replicas that failed together spread over the whole window."""
    policy = Backoff(base=0.5, cap=30.0)
    top = policy.ceiling(failures)
    counts = [0] * 10
    for d in draws(policy, failures):
        assert 0.0 <= d <= top
        counts[min(9, int(d / top * 10))] += 1
    expected = SAMPLES / 10
    chi2 = sum((c - expected) ** 2 / expected for c in counts)
    assert chi2 < 27.88, counts


def test_the_spread_is_full_not_a_small_jitter_around_the_ceiling() -> None:
    """Draws reach both ends of the window: the lowest tenth and the highest tenth are both
    hit, and the mean is half the ceiling (not the ceiling plus a little noise)."""
    policy = Backoff(base=1.0, cap=60.0)
    values = draws(policy, 4)  # ceiling 16 s
    assert min(values) < 1.6 and max(values) > 14.4
    assert abs(sum(values) / len(values) - 8.0) < 0.25


@pytest.mark.parametrize(("failures", "ceiling"),
                         [(0, 0.5), (1, 1.0), (2, 2.0), (5, 16.0), (6, 30.0), (10_000, 30.0)])
def test_the_window_doubles_then_stops_at_the_cap(failures: int, ceiling: float) -> None:
    """base * 2**n, capped: even after ten thousand failures (no overflow) the wait is at
    most ``cap``."""
    policy = Backoff(base=0.5, cap=30.0)
    assert policy.ceiling(failures) == ceiling
    assert max(draws(policy, failures)[:2_000]) <= ceiling


def test_two_replicas_failing_together_do_not_retry_in_lockstep() -> None:
    """Two processes that failed at the same moment (different seeds) wait different times:
    fewer than 1% of their paired retries fall within 10 ms of each other at a 4 s window."""
    policy = Backoff(base=0.5, cap=30.0)
    a, b = draws(policy, 3, seed=1), draws(policy, 3, seed=2)
    close = sum(1 for x, y in zip(a, b, strict=True) if abs(x - y) < 0.01)
    assert close / SAMPLES < 0.01


@pytest.mark.parametrize("kwargs", [{"base": 0, "cap": 1}, {"base": 1, "cap": 0},
                                    {"base": 1, "cap": 1, "factor": 0.5}])
def test_a_policy_that_cannot_grow_or_wait_is_refused(kwargs: dict[str, float]) -> None:
    """Zero base, zero cap or a shrinking factor is a programming error, refused at once."""
    with pytest.raises(ValueError):
        Backoff(**kwargs)


def test_a_negative_failure_count_is_refused() -> None:
    """Failures count from zero."""
    with pytest.raises(ValueError):
        Backoff(base=1, cap=2).delay(-1)
