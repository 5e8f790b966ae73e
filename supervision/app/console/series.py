"""The charts' series: the per-minute rollup (``safetynet.job_minutes``, migration 0016)
read for a span and summed into equal slots.

>>> span = SPANS["1h"]                            # 60 slots of a minute; "24h": 144 of 10
>>> minutes = read_minutes(conn, ["recording-finalize"], span)
>>> minutes.slots["recording-finalize"][-1].outcomes["reconciled"]

One query (``job_minutes_since``: the primary key, one range per job, at most 1,440 rows
a job a day, summed into the span's slots by the database: 60 or 144 rows a job), then
plain Python: every slot of the span is there, empty when no cycle wrote in it, so a
chart's x axis is the same whether or not the jobs ran.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Sequence
from typing import Any

import attrs
import psycopg
from psycopg.rows import dict_row

from actors.outbox.state import ACK_BUCKETS_MS
from actors.rollup import OUTCOMES
from supervision.db.queries import QUERIES


@attrs.frozen
class Span:
    name: str
    seconds: int
    step: int  # seconds per slot

    @property
    def slots(self) -> int:
        return self.seconds // self.step

    @property
    def per(self) -> str:
        return "minute" if self.step == 60 else f"{self.step // 60} minutes"


SPANS = {"1h": Span("1h", 3600, 60), "24h": Span("24h", 86400, 600)}


@attrs.define
class Slot:
    """What the cycles of one job wrote in one slot (summed; backlogs: the largest)."""

    cycles: int = 0
    outcomes: Counter[str] = attrs.field(factory=Counter)
    backlog: int | None = None
    oldest_age_s: float | None = None
    published: int = 0
    ack_ms_max: int = 0
    ack_ms_buckets: list[int] = attrs.field(factory=lambda: [0] * (len(ACK_BUCKETS_MS) + 1))
    failed_ticks: int = 0
    restarts: int = 0
    lease_changes: int = 0

    def add(self, row: dict[str, Any]) -> None:
        self.cycles += int(row["cycles"] or 0)
        self.outcomes.update({name: int(row[name] or 0) for name in OUTCOMES})
        self.backlog = _larger(self.backlog, row["backlog"])
        self.oldest_age_s = _larger(self.oldest_age_s, row["oldest_age_s"])
        self.published += int(row["published"] or 0)
        self.ack_ms_max = max(self.ack_ms_max, int(row["ack_ms_max"] or 0))
        buckets = row["ack_ms_buckets"] or ()
        if any(buckets):
            for i, n in enumerate(buckets[:len(self.ack_ms_buckets)]):
                self.ack_ms_buckets[i] += int(n or 0)
        self.failed_ticks += int(row["failed_ticks"] or 0)
        self.restarts += int(row["restarts"] or 0)
        self.lease_changes += int(row["lease_changes"] or 0)

    def ack_ms_p99(self) -> float | None:
        """The upper bound of the bucket holding the 99th percentile (the largest latency
        seen when it falls in the last bucket); None without published rows."""
        total = sum(self.ack_ms_buckets)
        if total == 0:
            return None
        seen = 0
        for i, n in enumerate(self.ack_ms_buckets):
            seen += n
            if seen >= 0.99 * total:
                bound = ACK_BUCKETS_MS[i] if i < len(ACK_BUCKETS_MS) else self.ack_ms_max
                return float(min(bound, self.ack_ms_max) if self.ack_ms_max else bound)
        return float(self.ack_ms_max)


def _larger(a: Any, b: Any) -> Any:
    if a is None:
        return b
    return a if b is None else max(a, b)


@attrs.frozen
class Minutes:
    """The span's slot starts (oldest first) and each job's slots."""

    span: Span
    starts: list[dt.datetime]
    slots: dict[str, list[Slot]]


def slotted(rows: Sequence[dict[str, Any]], jobs: Sequence[str], span: Span,
            now: dt.datetime) -> Minutes:
    """*rows* (job_minutes rows) summed into *span*'s slots ending with the one that holds
    *now* (the database's current minute)."""
    step = dt.timedelta(seconds=span.step)
    epoch = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
    last = epoch + ((now - epoch) // step) * step
    first = last - step * (span.slots - 1)
    starts = [first + step * i for i in range(span.slots)]
    slots = {job: [Slot() for _ in starts] for job in jobs}
    for row in rows:
        index = (row["minute"] - first) // step
        if row["job"] in slots and 0 <= index < span.slots:
            slots[row["job"]][index].add(row)
    return Minutes(span, starts, slots)


def read_minutes(conn: psycopg.Connection, jobs: Sequence[str], span: Span) -> Minutes:
    """The rollup of *jobs* over *span*, slotted (one read of the primary key)."""
    now_row = conn.execute(QUERIES["job_minutes_now"]).fetchone()
    assert now_row is not None
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(QUERIES["job_minutes_since"], {
            "jobs": list(jobs), "seconds": span.seconds, "step": span.step}).fetchall()
    return slotted(rows, jobs, span, now_row[0])
