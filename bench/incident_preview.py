"""An incident's preview on big tables (issue #38 item 3): each filter's statement time and
plan.

A benchmark (not a test); it prints figures and asserts no timing. The tables are
``bench/console_pages.py``'s (``--rows`` recordings, every 7th finalize row Quarantined
with one ``last_error``; ``--outbox`` outbox rows, a few dead-lettered). Each filter is
previewed ``--repeat`` times through :func:`supervision.app.incidents.preview` after one
warm-up; printed: the median and the 95th percentile in ms, as a ratio to a baseline
measured in the same run (one ``SELECT 1``), how many ids it froze, and the index its
plan walks with the buffers it read. The worst case is a window holding more rows than
the preview examines (50,000): the pattern matching all of them (10,000 ids frozen) or
none (50,000 rows read for nothing).

    .venv/bin/python bench/incident_preview.py [--rows 1000000] [--outbox 1000000] [--repeat 10]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._measure import percentile
from bench.console_pages import seed
from supervision.app import incidents
from supervision.app.queries import ALL_QUERIES
from supervision.db.migrate import install_demo
from supervision.dev.postgres import PostgresServer
from supervision.dev.processes import start_all, stop_all

FILTERS = {
    "requeue Quarantined, since 1d, error matches all": (
        "requeue", {"status": "Quarantined", "since": "1d", "error": "content_type*html"}),
    "requeue Quarantined, since 1d, error matches none": (
        "requeue", {"status": "Quarantined", "since": "1d", "error": "no such error"}),
    "requeue Quarantined, a window of yesterday (empty)": (
        "requeue", {"status": "Quarantined", "since": "2d", "until": "1d"}),
    "requeue Pending, due from now on": (
        "requeue", {"status": "Pending", "since": "0s", "until": "2099-01-01"}),
    "replay, since 1d, key prefix": ("replay", {"since": "1d", "key_prefix": "0"}),
    "release, any": ("release", {}),
}


def run(dsn: str, repeat: int) -> list[str]:
    lines = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        base = []
        for _ in range(repeat * 5):
            started = time.perf_counter()
            conn.execute(ALL_QUERIES["console_ping"]).fetchone()
            base.append(time.perf_counter() - started)
        baseline = statistics.median(base)
        lines.append(f"baseline (SELECT 1): median {baseline * 1000:.2f} ms")
        for label, (verb, given) in FILTERS.items():
            f = incidents.parse_filter(verb, given)
            times, seen = [], incidents.preview(conn, f)
            for _ in range(repeat):
                started = time.perf_counter()
                seen = incidents.preview(conn, f)
                times.append(time.perf_counter() - started)
            median = statistics.median(times)
            lines.append(f"{label:52} median {median * 1000:7.1f} ms  p95 "
                         f"{percentile(times, 0.95) * 1000:7.1f} ms  "
                         f"{median / baseline:6.0f}x  froze {seen.count:6}  "
                         f"{plan(conn, f)}")
    return lines


def plan(conn: psycopg.Connection, f: incidents.Filter) -> str:
    name = {("requeue", "Quarantined"): "incident_finalize_quarantined",
            ("requeue", "Pending"): "incident_finalize_pending",
            ("replay", None): "incident_dead_letters",
            ("release", None): "incident_poison"}[(f.verb.value, f.status)]
    text = "\n".join(r[0] for r in conn.execute(
        ("EXPLAIN (ANALYZE, BUFFERS) " + ALL_QUERIES[name]).encode(), {
            "since": f.since, "until": f.until, "pattern": incidents.like_pattern(f.error),
            "topic": f.topic, "key_prefix": f.key_prefix, "examine": incidents.EXAMINE_MAX,
            "limit": incidents.SNAPSHOT_MAX + 1}))
    index = re.search(r"((?:Bitmap )?Index (?:Only )?Scan (?:using|on) \w+"
                      r"|Seq Scan on \w+)", text)
    buffers = next((line.strip() for line in text.splitlines() if "Buffers:" in line), "")
    return f"{index.group(1) if index else '?'}; {buffers}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--outbox", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-incident-"))
    pg = PostgresServer(tmp)
    try:
        start_all([pg])
        install_demo(pg.dsn)
        started = time.perf_counter()
        seed(pg.dsn, args.rows, args.outbox)
        print(f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}; seeded {args.rows}"
              f" recordings and {args.outbox} outbox rows in"
              f" {time.perf_counter() - started:.0f} s", flush=True)
        print("\n".join(run(pg.dsn, args.repeat)))
    finally:
        stop_all([pg])
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
