"""The frame around one cycle of a job, shared by every lock-keeper job.

>>> async with cycle_frame(Job.RECORDING_FINALIZE, ctx.job_run_id, counts, log, RF_RUNS,
...                        RF_CYCLE_DURATION, after=refresh) as frame:
...     if misconfigured:
...         frame.status = RunStatus.CONFIG_FAULT
...         return counts
...     ...                                   # the cycle's work, filling *counts*

Around the body: a ``<job>.cycle`` span carrying the non-zero counts; the elapsed time in
``counts.duration_ms`` and the job's duration histogram; the run counter labelled with
the status; the counts as the job's last cycle (``safetynet_last_cycle{job,outcome}``);
one ``cycle_completed`` log line with the status and the counts (or, with ``log_if``,
only for cycles that did something); then *after* (a gauge refresh), bounded
and shielded so that it runs on every exit path and never fails the cycle.

Status: ``ok`` when the body finishes (unless it set another one), ``cancelled`` when a
stop cancelled it (a stop is not a failure), ``error`` when it raised.

What cancellation does: the body is cancelled like any other work; the bookkeeping in
the frame's exit has no checkpoint except *after*, which runs shielded for at most 2 s.
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, Protocol

import attrs
import trio
from prometheus_client import Counter, Histogram

from actors.tracing import span
from supervision.jobs import Job
from supervision.metrics import LAST_CYCLES

AFTER_LIMIT_S = 2.0


class RunStatus(enum.StrEnum):
    """The ``status`` label of a job's run counter and of its ``cycle_completed`` line."""

    OK = "ok"
    ERROR = "error"
    CANCELLED = "cancelled"
    CONFIG_FAULT = "config_fault"  # a dependency is misconfigured: nothing was attempted


class Counts(Protocol):
    """A cycle's counts: a ``duration_ms`` field and a flat JSON view."""

    duration_ms: int

    def as_json(self) -> dict[str, Any]: ...


class Logger(Protocol):
    def info(self, event: str, **kw: Any) -> Any: ...


@attrs.define
class Frame:
    """What the body may set: the status, when it is not plain ok/error/cancelled."""

    status: RunStatus | None = None


@asynccontextmanager
async def cycle_frame(
    job: Job, job_run_id: str, counts: Counts, log: Logger,
    runs: Counter | None = None, duration: Histogram | None = None, *,
    after: Callable[[], Awaitable[None]] | None = None,
    log_if: Callable[[], bool] | None = None,
) -> AsyncIterator[Frame]:
    """Span, timing, run metric and ``cycle_completed`` around one cycle of *job*."""
    started = trio.current_time()
    frame = Frame()
    outcome = RunStatus.ERROR
    with span(f"{job}.cycle", job_run_id=job_run_id) as cycle_span:
        try:
            yield frame
            outcome = frame.status or RunStatus.OK
        except trio.Cancelled:
            outcome = RunStatus.CANCELLED
            raise
        except BaseExceptionGroup as group:  # a nursery's: a stop if only Cancelled inside
            if group.split(trio.Cancelled)[1] is None:
                outcome = RunStatus.CANCELLED
            raise
        finally:
            elapsed = trio.current_time() - started
            counts.duration_ms = int(elapsed * 1000)
            figures = counts.as_json()
            cycle_span.set_attributes({k: v for k, v in figures.items() if v})
            LAST_CYCLES.record(job, str(outcome), figures)
            if runs is not None:
                runs.labels(status=outcome).inc()
            if duration is not None:
                duration.observe(elapsed)
            if log_if is None or log_if():
                log.info("cycle_completed", status=str(outcome), **figures)
            if after is not None:
                with trio.move_on_after(AFTER_LIMIT_S, shield=True), \
                        contextlib.suppress(Exception):  # a refresh never fails a cycle
                    await after()
