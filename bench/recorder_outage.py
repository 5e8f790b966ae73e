"""Does a running daemon drain a recorder outage within the seed's SLO? (issue 25)

A benchmark (not a test). The seed (recording-finalize-retry) promises that no recording
stays non-terminal longer than FinalizeSlaTimeout + one PollingInterval (60 s by default):
once a recording is due, it is terminal within one default polling interval. The issue's
scenario: a recorder outage lost the binaries of 57,000 of 60,000 due recordings, and
``safetynet run`` polls every second. Two halves of the promise are measured in each round,
alternating which goes first:

  outage        ``--rows`` due recordings (default 60,000), of which the first
                ``--present`` fraction (default 0.05) has its binary in SeaweedFS (content
                type and duration: Available) and the rest has none (404: Failed/Timeout,
                the found objects of the same cycles being the evidence that the key
                mapping is right).
  all present   the same number of due recordings, every binary uploaded: the baseline,
                the drain when nothing is lost.

Each drain runs in a fresh ``safetynet run`` subprocess (``python -m supervision.app run
-c F``) at the default settings except ``jobs.recording_finalize.polling_interval = 1s``,
with the outbox relay off (no broker here) and the conference reaper off (nothing to
reap); JSON logs at info to a file. Once it is ready (``/readyz`` 200, two finalize cycles
started: connections open, the S3 worker running), the rows are seeded set-based in one
statement (``bench/recording_finalize.py``'s rows: an ended 1:1 call an hour ago, its
Uploading recording, a Pending finalize row due now — past the default 30 min SLA, so due
at the seed's commit; no ``VACUUM ANALYZE``, as in a running system). The binaries are
uploaded before the daemon starts, so the clock starts with the seed's commit (database
clock) and stops with the last recording terminal (the latest ``updated_at`` the daemon
wrote). Printed per drain: seconds to the last terminal row, rows/s over them, when the
first and median rows were terminal, the verdicts (Available / Failed, Quarantined
finalize rows), the finalize cycles it took, the ``missing_verdicts_withheld`` and
``config_fault`` log events (any withheld verdict would stop the drain short of its Failed
rows), and the cores the daemon (with its S3 worker), PostgreSQL and weed kept busy.
Then the ratio outage rows/s / all-present rows/s per round, and the verdict against the
SLO: the worst drain terminal within one default polling interval of the commit, with the
margin.

It starts its own PostgreSQL and SeaweedFS (``supervision.dev.stack``, in a temp dir) and
always stops them and the daemons. Run:

    .venv/bin/python bench/recorder_outage.py [--rows 60000] [--present 0.05] [--rounds 2]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import psycopg
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._measure import CpuMeter, spread
from bench.recording_finalize import BUCKET, RESET, SEED, rid, upload
from supervision.app.settings import config_from_dict
from supervision.db.migrate import install_demo
from supervision.dev.postgres import PostgresServer
from supervision.dev.processes import start_all, stop_all
from supervision.dev.s3 import S3Server
from supervision.jobs import Job
from supervision.logs import configure_logging
from tests.chaos.daemon import Daemon
from tests.messenger import PREFIX

# recording_finalize.py's rows, every one Uploading (none Available-unpublished)
OUTAGE_SEED = SEED.replace("%(all_available)s OR n %% 10 = 9 AS available", "false AS available")
assert OUTAGE_SEED != SEED
PENDING = "SELECT count(*) FROM messenger.recording_finalize_attempts WHERE status = 'Pending'"
# seconds after the commit (t0) at which the recordings became terminal, and the verdicts
OUTCOME = """
WITH t AS (
    SELECT status, EXTRACT(EPOCH FROM updated_at - %(t0)s)::float8 AS s
    FROM messenger.call_recordings
)
SELECT count(*) FILTER (WHERE status = 'Available'),
       count(*) FILTER (WHERE status = 'Failed'),
       (SELECT count(*) FROM messenger.recording_finalize_attempts
        WHERE status = 'Quarantined'),
       min(s) FILTER (WHERE status IN ('Available', 'Failed')),
       percentile_cont(0.5) WITHIN GROUP (ORDER BY s)
           FILTER (WHERE status IN ('Available', 'Failed')),
       max(s) FILTER (WHERE status IN ('Available', 'Failed'))
FROM t
"""
FINALIZE = Job.RECORDING_FINALIZE
DEFAULTS = config_from_dict({"postgres": {"dsn": "postgresql://127.0.0.1/unused"}})
# the seed's SLO once a recording is due: one polling interval at its default (60 s)
SLO_S = DEFAULTS.jobs.recording_finalize.polling_interval


def daemon_config(pg: PostgresServer, s3: S3Server) -> dict[str, Any]:
    """The defaults, but a 1 s polling interval; no relay (no broker), no reaper."""
    creds = s3.credentials
    return {
        "postgres": {"dsn": pg.dsn},
        "s3": {"endpoint_url": s3.endpoint_url, "bucket": BUCKET, "key_prefix": PREFIX,
               "access_key_id": creds.access_key_id,
               "secret_access_key": creds.secret_access_key, "region": creds.region},
        "jobs": {"recording_finalize": {"polling_interval": "1s"},
                 "conference_reaper": {"enabled": False}},
        "outbox_relay": {"enabled": False},
        "logging": {"format": "json", "level": "info"},
    }


def cycles_started(daemon: Daemon) -> int:
    return sum(1 for e in daemon.events()
               if e.get("event") == "cycle_started" and e.get("job") in (None, FINALIZE))


def wait_ready(daemon: Daemon, timeout: float = 60) -> None:
    """/readyz 200 and two finalize cycles started (the first one has finished)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not daemon.alive():
            raise RuntimeError(f"daemon exited:\n{daemon.tail()}")
        with contextlib.suppress(httpx.HTTPError):
            ready = httpx.get(f"http://127.0.0.1:{daemon.port}/readyz", timeout=1)
            if ready.status_code == 200 and cycles_started(daemon) >= 2:
                return
        time.sleep(0.2)
    raise RuntimeError(f"daemon not ready after {timeout:.0f} s:\n{daemon.tail()}")


def scalar(conn: psycopg.Connection[Any], query: str) -> Any:
    row = conn.execute(query).fetchone()
    assert row is not None
    return row[0]


def drain(base_dir: Path, pg: PostgresServer, s3: S3Server, tag: str, rows: int,
          present: int, limit_s: float) -> dict[str, Any]:
    """One drain by a fresh daemon: seed *rows* due recordings of *tag* (the binaries of
    the first *present* uploaded beforehand) and wait until none is Pending."""
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        conn.execute(RESET)
    daemon = Daemon(base_dir, f"{tag}-daemon", daemon_config(pg, s3)).start()
    try:
        wait_ready(daemon)
        before = daemon.events()
        meter = CpuMeter({"daemon": daemon.pid, "postgres": pg.pid, "weed": s3.pid})
        with psycopg.connect(pg.dsn, autocommit=True) as conn:
            conn.execute(OUTAGE_SEED, {"tag": tag, "rows": rows, "all_available": False,
                                       "prefix": PREFIX})
            t0: dt.datetime = scalar(conn, "SELECT clock_timestamp()")  # just after commit
            meter.start()
            deadline = time.monotonic() + limit_s
            left = rows
            while left and time.monotonic() < deadline and daemon.alive():
                time.sleep(0.25)
                left = int(scalar(conn, PENDING))
            meter.stop()
            row = conn.execute(OUTCOME, {"t0": t0}).fetchone()
            assert row is not None
        after = daemon.events()[len(before):]
    finally:
        code = daemon.terminate()
    available, failed, quarantined, first, median, last = row
    names = [e.get("event") for e in after]
    withheld = [e for e in after if e.get("event") == "missing_verdicts_withheld"]
    out = {"available": available, "failed": failed, "quarantined": quarantined,
           "left": left, "first": first, "median": median, "last": last,
           "drained": left == 0 and available + failed == rows,
           "rate": rows / last if left == 0 and last else 0.0,
           "cycles": sum(1 for e in after if e.get("event") == "cycle_started"
                         and e.get("job") in (None, FINALIZE)),
           "withheld_events": len(withheld),
           "withheld_rows": sum(int(e.get("withheld", 0)) for e in withheld),
           "config_faults": names.count("config_fault"),
           "cores": meter.used, "wall": meter.wall, "load": os.getloadavg()[0],
           "expected": (present, rows - present), "exit": code}
    if not out["drained"]:
        out["tail"] = daemon.tail(2000)
    return out


def line(name: str, r: dict[str, Any]) -> str:
    wall = r["wall"] or 1.0
    busy = " ".join(f"{k} {v / wall:.2f}" for k, v in r["cores"].items()
                    if k in ("daemon", "postgres", "weed"))
    done = (f"{r['last']:7.2f}{r['rate']:8.0f}" if r["drained"]
            else f"{'NOT DRAINED: ' + str(r['left']) + ' left':>15}")
    wrong = "" if (r["available"], r["failed"]) == r["expected"] else (
        f"  UNEXPECTED: wanted {r['expected'][0]} Available / {r['expected'][1]} Failed")
    return (f"  {name:12}{done}{r['first'] or 0:7.2f}{r['median'] or 0:8.2f}"
            f"{r['available']:10d}{r['failed']:8d}{r['quarantined']:6d}{r['cycles']:7d}"
            f"{r['withheld_events']:9d}{r['config_faults']:7d}   {busy}{r['load']:7.2f}{wrong}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=60_000,
                        help="due recordings per drain (default 60000)")
    parser.add_argument("--present", type=float, default=0.05,
                        help="fraction of them whose binary exists in the outage (default 0.05)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds (default 2)")
    parser.add_argument("--limit", type=float, default=10 * SLO_S,
                        help=f"give a drain up this many seconds (default {10 * SLO_S:.0f})")
    args = parser.parse_args()
    if args.rows < 1 or not 0 <= args.present <= 1 or args.rounds < 1:
        parser.error("--rows >= 1, 0 <= --present <= 1, --rounds >= 1")
    present = round(args.rows * args.present)
    configure_logging("info", "json", stream=open(os.devnull, "w"))  # noqa: SIM115
    base_dir = Path(tempfile.mkdtemp(prefix="bench-outage-"))
    pg, s3 = PostgresServer(base_dir), S3Server(base_dir)
    try:
        start_all([pg, s3])
        install_demo(pg.dsn)
        s3.create_bucket(BUCKET)
        # outage rows are tagged "o", all-present rows "b": one bucket holds both sets
        keys = ([f"{PREFIX}{rid('o', n)}" for n in range(present)]
                + [f"{PREFIX}{rid('b', n)}" for n in range(args.rows)])
        upload_s = trio.run(upload, s3, keys, 32)
        rf = DEFAULTS.jobs.recording_finalize
        print(f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f} | rows={args.rows}"
              f" present={args.present} ({present} binaries, {args.rows - present} lost)"
              f" rounds={args.rounds} | safetynet run: polling_interval 1s, otherwise"
              f" defaults (batch_size {rf.batch_size}, s3.concurrency"
              f" {DEFAULTS.s3.concurrency}, finalize_sla_timeout"
              f" {rf.finalize_sla_timeout:.0f}s), relay and reaper off | {len(keys)} objects"
              f" uploaded ({len(keys) / upload_s:.0f} PUT/s)", flush=True)
        print("columns: last = s from the seed's commit to the last row terminal; rows/s ="
              " rows / last; first, median = s to the first and the median row terminal;"
              " Quar = Quarantined finalize rows; withheld = missing_verdicts_withheld events;"
              " faults = config_fault events; cores busy over the drain (the daemon with its"
              " S3 worker, PostgreSQL, weed); load at the end")
        print(f"  {'drain':12}{'last':>7}{'rows/s':>8}{'first':>7}{'median':>8}"
              f"{'Available':>10}{'Failed':>8}{'Quar':>6}{'cycles':>7}{'withheld':>9}"
              f"{'faults':>7}   cores busy")
        rounds: list[tuple[dict[str, Any], dict[str, Any]]] = []
        for n in range(args.rounds):
            print(f"round {n + 1}", flush=True)
            order = ("outage", "all present") if n % 2 == 0 else ("all present", "outage")
            got: dict[str, dict[str, Any]] = {}
            for name in order:
                if name == "outage":
                    got[name] = drain(base_dir, pg, s3, "o", args.rows, present, args.limit)
                else:
                    got[name] = drain(base_dir, pg, s3, "b", args.rows, args.rows, args.limit)
                print(line(name, got[name]), flush=True)
                if "tail" in got[name]:
                    print(f"    daemon log tail:\n{got[name]['tail']}", flush=True)
            rounds.append((got["outage"], got["all present"]))
        report(rounds)
    finally:
        stop_all([pg, s3])
        shutil.rmtree(base_dir, ignore_errors=True)


def report(rounds: list[tuple[dict[str, Any], dict[str, Any]]]) -> None:
    outage = [o for o, _ in rounds]
    baseline = [b for _, b in rounds]
    if all(r["drained"] for r in outage + baseline):
        ratios = [o["rate"] / b["rate"] for o, b in rounds]
        print(f"\noutage rows/s {spread([o['rate'] for o in outage])}; all present"
              f" {spread([b['rate'] for b in baseline])}; outage / all present"
              f" {spread(ratios, '{:.2f}')} (per round: "
              + ", ".join(f"{r:.2f}" for r in ratios) + ")")
    else:
        print("\nnot every drain finished within --limit: no rate ratio")
    events = sum(r["withheld_events"] for r in outage + baseline)
    verdicts = sum(r["withheld_rows"] for r in outage + baseline)
    print("missing_verdicts_withheld: "
          + (f"{events} events, {verdicts} verdicts withheld" if events else "none"))
    for name, drains in (("outage", outage), ("all present", baseline)):
        question = (f"SLO, {name}: every row terminal within one default polling interval"
                    f" ({SLO_S:.0f} s) of becoming due?")
        if not all(r["drained"] for r in drains):
            print(f"{question} NO, not drained within --limit")
            continue
        lasts = [r["last"] for r in drains]
        worst = max(lasts)
        verdict = (f"yes, margin {SLO_S - worst:.1f} s" if worst <= SLO_S
                   else f"NO, {worst - SLO_S:.1f} s over")
        print(f"{question} worst drain {worst:.1f} s (median {statistics.median(lasts):.1f}"
              f" s): {verdict}")


if __name__ == "__main__":
    main()
