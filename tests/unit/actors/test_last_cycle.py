"""Each job's last cycle is exported at cycle end (``safetynet_last_cycle``) and read back
by the console from a daemon's exposition."""

from __future__ import annotations

import time
from typing import Any

import attrs
import pytest
import structlog
import trio
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from structlog.testing import capture_logs
from structlog.typing import FilteringBoundLogger

from actors.cycle_frame import cycle_frame
from supervision.app.console.daemon_metrics import parse
from supervision.metrics import LastCycles


@attrs.define
class FakeCounts:
    reconciled: int = 0
    failed: int = 0
    duration_ms: int = 0

    def as_json(self) -> dict[str, Any]:
        return attrs.asdict(self)


@attrs.define
class OtherCounts:
    published: int = 0
    duration_ms: int = 0

    def as_json(self) -> dict[str, Any]:
        return attrs.asdict(self)


def last(job: str, outcome: str) -> float | None:
    return REGISTRY.get_sample_value("safetynet_last_cycle", {"job": job, "outcome": outcome})


def ended(job: str, status: str) -> float | None:
    return REGISTRY.get_sample_value("safetynet_last_cycle_end_timestamp_seconds",
                                     {"job": job, "status": status})


async def test_cycle_end_sets_the_jobs_last_cycle_counts_replacing_the_previous_cycle(
        ) -> None:
    """A cycle's counts are exported at its end with its status; the next cycle of the
    job replaces them whole (a count it does not have disappears), an error included."""
    log: FilteringBoundLogger = structlog.get_logger("test")
    job = "last-cycle-test-job"
    counts = FakeCounts()
    before = time.time()
    with capture_logs():
        async with cycle_frame(job, "run-1", counts, log):
            counts.reconciled, counts.failed = 4, 1
            assert last(job, "reconciled") is None  # set at the end, not before
            await trio.sleep(0.01)
    assert (last(job, "reconciled"), last(job, "failed")) == (4.0, 1.0)
    assert (last(job, "duration_ms") or 0) >= 10
    assert (ended(job, "ok") or 0) >= before
    other = OtherCounts()
    with capture_logs(), pytest.raises(RuntimeError):
        async with cycle_frame(job, "run-2", other, log):
            other.published = 2
            raise RuntimeError("boom")
    assert last(job, "published") == 2.0
    assert last(job, "reconciled") is None and ended(job, "ok") is None
    assert ended(job, "error") is not None


def test_console_reads_each_jobs_last_cycle_from_the_exposition() -> None:
    """The console picks each job's last counts, status and age out of /metrics."""
    registry = CollectorRegistry()
    cycles = LastCycles()
    registry.register(cycles)
    cycles.record("recording-finalize", "ok", {"reconciled": 3, "failed": 0,
                                               "duration_ms": 120, "note": "x"})
    seen = parse("u", generate_latest(registry).decode(), now=time.time() + 5)
    assert seen.last_cycle == {"recording-finalize": {
        "reconciled": 3.0, "failed": 0.0, "duration_ms": 120.0}}
    assert seen.last_status == {"recording-finalize": "ok"}
    assert 4 <= seen.last_age_s["recording-finalize"] <= 6
