"""The console's delivery figure: events, mean and p99 of
safetynet_outbox_delivery_seconds, read from the daemon's /metrics."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram, generate_latest

from supervision.app.console.daemon_metrics import parse


def metrics_text(observations: list[float]) -> str:
    registry = CollectorRegistry()
    histogram = Histogram("safetynet_outbox_delivery_seconds", "d", registry=registry,
                          buckets=(0.01, 0.05, 0.1, 1.0))
    for seconds in observations:
        histogram.observe(seconds)
    return generate_latest(registry).decode()


def test_the_p99_is_the_bound_of_the_bucket_that_holds_it() -> None:
    view = parse("u", metrics_text([0.004] * 98 + [0.07, 0.5]))
    assert view.delivery is not None
    count, mean, p99 = view.delivery
    assert count == 100
    assert abs(mean - (0.004 * 98 + 0.57) / 100) < 1e-9
    assert p99 == 0.1


def test_no_event_observed_is_no_figure() -> None:
    assert parse("u", metrics_text([])).delivery is None
    assert parse("u", "").delivery is None
