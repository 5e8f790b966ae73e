"""HEADs per hour of a withheld backlog (issue #36, item 6): before and after the hold-off.

    .venv/bin/python bench/withheld_heads.py --rows 100000 --rate 340 --rate 1500

A schedule simulation at the default settings (polling_interval 60 s, max_run_duration
180 s, backoff_base 1 min, backoff_cap 15 min, finalize_sla_timeout 30 min) over a backlog
whose every HEAD answers 404 and whose verdicts are all withheld (a wrong prefix on a fresh
install), fed with HEAD rates measured by real runs (docs/benchmarks.md: the latency-bound
drain at c=8 and 20 ms, 0.85 x 400 = 340 HEAD/s; the local mixed drain, 1,170-2,030
rows/s). Each cycle starts on a tick (a cycle that overruns coalesces the missed ones),
claims due rows in next_attempt_at order at *rate* per second until nothing is due or
max_run_duration has passed, and gives every row back:

* before: with its old next_attempt_at (due again at the next cycle, first in line);
* after: after its hold-off (:class:`actors.finalize.holdoff.HoldOff`, the code itself).

The rows became due at t = 0 (the worst case for the hold-off: it starts at backoff_base
and doubles; an older backlog is at backoff_cap from its first withheld HEAD). Prints the
HEADs of the first hour and of the third, and how many rows were never HEADed.
"""

from __future__ import annotations

import argparse
import datetime as dt
import heapq

from actors.finalize.holdoff import HoldOff
from actors.finalize.messages import ClaimedRow
from actors.finalize.settings import RecordingFinalizeConfig

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def simulate(rows: int, rate: float, hold_off: bool, hours: int = 3) -> list[tuple[int, int]]:
    """Per hour: (HEADs, rows HEADed at least once so far)."""
    cfg = RecordingFinalizeConfig()
    ended = T0 - dt.timedelta(seconds=cfg.finalize_sla_timeout)  # due at t = 0
    row = ClaimedRow(attempt_id="a", recording_id="r", session_kind="Direct",
                     session_id="s", attempts=1, phase="reconcile",
                     recording_status="Uploading", old_attempts=0, old_next_attempt_at=T0,
                     session_ended_at=ended)
    due = [(0.0, n) for n in range(rows)]  # (next_attempt_at in s, row), a heap
    heads = [0] * hours
    seen: list[set[int]] = [set() for _ in range(hours)]  # rows HEADed by the hour's end
    t, done = 0.0, set()
    while t < hours * 3600:
        as_of, claimed = t, []
        while due and due[0][0] <= as_of and len(claimed) < rate * cfg.max_run_duration:
            claimed.append(heapq.heappop(due))
        delay = HoldOff.of(cfg, T0 + dt.timedelta(seconds=as_of)).delay(row)
        for i, (next_at, n) in enumerate(claimed):
            hour = int((as_of + i / rate) // 3600)  # its HEAD, at the cycle's pace
            if hour < hours:
                heads[hour] += 1
            done.add(n)
            heapq.heappush(due, (as_of + delay, n) if hold_off else (next_at, n))
        end = as_of + len(claimed) / rate
        for hour in range(hours):
            if not seen[hour] and end >= (hour + 1) * 3600:
                seen[hour] = set(done)
        ticks = int(end // cfg.polling_interval) + 1  # the next tick after the cycle
        t = max(ticks * cfg.polling_interval, t + cfg.polling_interval)
    return [(heads[h], len(seen[h] or done)) for h in range(hours)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--rate", type=float, action="append",
                        help="HEADs per second the cycle reaches (repeatable)")
    args = parser.parse_args()
    for rate in args.rate or [340.0, 1500.0]:
        for label, hold in (("before", False), ("after", True)):
            hours = simulate(args.rows, rate, hold)
            (h1, seen1), (_, _), (h3, seen3) = hours
            print(f"{args.rows} withheld rows, {rate:,.0f} HEAD/s, {label}: hour 1 "
                  f"{h1:,} HEADs ({h1 / args.rows:.1f}/row, {args.rows - seen1:,} rows never"
                  f" HEADed), hour 3 {h3:,} ({h3 / args.rows:.1f}/row,"
                  f" {args.rows - seen3:,} never HEADed)")


if __name__ == "__main__":
    main()
