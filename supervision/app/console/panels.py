"""Which charts a page shows: the overview (every job) and each job's page.

>>> charts = panels(read_minutes(conn, JOBS, SPANS["1h"]), JOBS)

Verdicts per slot by outcome (recording-finalize's reconciled, republished, failed,
quarantined, withheld and configuration faults; the conference reaper's own; on the
relay's page its published and failed rows), backlog and oldest age per job, the relay's
rate and its commit-to-ack latency (largest and 99th percentile), and the keepers'
restarts, lease changes and failed ticks.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from supervision.app.console import inputs
from supervision.app.console.charts import Chart, bar_chart, line_chart
from supervision.app.console.series import SPANS, Minutes, Slot, read_minutes
from supervision.jobs import Job

VERDICTS: dict[str, tuple[str, ...]] = {
    Job.RECORDING_FINALIZE: ("reconciled", "republished", "failed", "quarantined",
                             "withheld", "config_fault"),
    Job.CONFERENCE_REAPER: ("empty_timeout", "provision_failed", "stale_timeout", "errors"),
    Job.OUTBOX_RELAY: ("published", "failed"),
}


def _sum(minutes: Minutes, jobs: Sequence[str], name: str) -> list[float | None]:
    return [float(sum(minutes.slots[job][i].outcomes.get(name, 0) for job in jobs))
            for i in range(len(minutes.starts))]


def verdicts(minutes: Minutes, jobs: Sequence[str]) -> Chart:
    """The outcomes of *jobs* (the relay's only on its own page: it has its rate chart)."""
    shown = [job for job in jobs if job != Job.OUTBOX_RELAY or len(jobs) == 1]
    series = [(name if len(shown) == 1 else _short(job, name),
               _sum(minutes, [job], name))
              for job in shown for name in VERDICTS.get(job, ())]
    return bar_chart("verdicts", f"Verdicts per {minutes.span.per}", "rows",
                     minutes.starts, series)


def _short(job: str, name: str) -> str:
    return name if job == Job.RECORDING_FINALIZE else f"{name} ({job.split('-')[-1]})"


def _per_job(minutes: Minutes, jobs: Sequence[str], field: str
             ) -> list[tuple[str, list[float | None]]]:
    out = []
    for job in jobs:
        values = [getattr(slot, field) for slot in minutes.slots[job]]
        out.append((job, [None if v is None else float(v) for v in values]))
    return out


def backlog(minutes: Minutes, jobs: Sequence[str]) -> Chart:
    return line_chart("backlog", "Backlog (largest of the slot)", "rows", minutes.starts,
                      _per_job(minutes, jobs, "backlog"))


def oldest_age(minutes: Minutes, jobs: Sequence[str]) -> Chart:
    aged = [job for job in jobs if job != Job.CONFERENCE_REAPER]  # the reaper has none
    return line_chart("oldest-age", "Oldest waiting row's age", "s", minutes.starts,
                      _per_job(minutes, aged or jobs, "oldest_age_s"))


def relay_rate(minutes: Minutes) -> Chart:
    slots = minutes.slots[Job.OUTBOX_RELAY]
    return bar_chart("relay-rate", f"Relay: rows published per {minutes.span.per}", "rows",
                     minutes.starts, [("published", [float(s.published) for s in slots])])


def relay_latency(minutes: Minutes) -> Chart:
    slots = minutes.slots[Job.OUTBOX_RELAY]
    return line_chart("relay-latency", "Relay: commit-to-ack latency", "ms", minutes.starts, [
        ("largest", [float(s.ack_ms_max) if s.published else None for s in slots]),
        ("p99 (bucket bound)", [s.ack_ms_p99() for s in slots])])


def keepers(minutes: Minutes, jobs: Sequence[str]) -> Chart:
    def total(pick: str) -> list[float | None]:
        return [float(sum(_field(minutes.slots[job][i], pick) for job in jobs))
                for i in range(len(minutes.starts))]
    return bar_chart("keepers", "Restarts, lease changes and failed ticks", "events",
                     minutes.starts, [("restarts", total("restarts")),
                                      ("lease changes", total("lease_changes")),
                                      ("failed ticks", total("failed_ticks"))])


def _field(slot: Slot, name: str) -> int:
    return int(getattr(slot, name))


def panels(minutes: Minutes, jobs: Sequence[str]) -> list[Chart]:
    """The charts of a page showing *jobs* (every job: the overview; one: its page)."""
    jobs = list(jobs)
    charts = [verdicts(minutes, jobs), backlog(minutes, jobs)]
    if jobs != [Job.CONFERENCE_REAPER]:
        charts.append(oldest_age(minutes, jobs))
    if Job.OUTBOX_RELAY in jobs:
        if len(jobs) > 1:
            charts.append(relay_rate(minutes))
        charts.append(relay_latency(minutes))
    charts.append(keepers(minutes, jobs))
    return charts


async def chart_context(read: Callable[..., Awaitable[Any]], params: Mapping[str, str],
                        jobs: Sequence[str]) -> dict[str, Any]:
    """A page's charts: the span chosen (``?span=1h|24h``, else the form's error) and the
    charts of *jobs* over it, from the per-minute rollup (*read* runs a read on the
    console's database)."""
    span = inputs.choice(params, "span", tuple(SPANS), "1h")
    minutes: Minutes = await read(read_minutes, list(jobs), SPANS[span])
    return {"charts": panels(minutes, jobs), "span": span, "spans": tuple(SPANS)}
