"""A million-row backlog: query plans, drain rate over the drain, memory (issue 15, item 2).

A benchmark (not a test); it prints figures and asserts no timing.

1. Plans at two backlog sizes. ``--small`` (default 10,000) and then ``--rows`` (default
   1,000,000) due finalize rows are seeded set-based (``bench/recording_finalize.py``'s
   rows: an ended 1:1 call, its recording, a Pending finalize row due now; every 10th
   recording Available-unpublished, the rest Uploading). At each size every claim and
   gauge query of recording-finalize, and the auditor actor's queries of recordings,
   finalize rows and the outbox (with the drain daemon's thresholds), run under
   ``EXPLAIN (ANALYZE, BUFFERS)`` (writes rolled back): a table of buffers and time per
   query at both sizes, and the full plans at the large size.
2. The drain. A sample of the Uploading rows (every ``--sample-every``-th) has its binary
   in SeaweedFS; the rest answer 404 and fail (Failed/Timeout: the found sample is the
   cycle's evidence, no cap paces the drain). ``safetynet run`` (a subprocess
   daemon, relay and reaper off) drains ``--drain`` rows (default: all); its /metrics
   counters are read every second, and the RSS of the daemon and its S3 worker sampled
   (psutil). Printed: the rows/s over the first and the last tenth of the drain and
   their ratio, the peak RSS of each process. ``--series FILE`` also writes every
   second's counter with the CPU of each process tree (daemon, PostgreSQL, weed, the
   machine), PostgreSQL's WAL and checkpoints and the autovacuum workers (CSV): what a
   slow stretch of the drain was competing with.
3. The reaper at ``--conferences`` active conferences (default 100,000) of which
   ``--due`` (default 10,000, a third per phase) are due, against ``--due`` active of
   which all are due: its claim and gauge queries under EXPLAIN at both, and the cycles
   (``run_reaper_cycle`` in-process until nothing is due, each followed by its backlog
   gauge refresh): ms per reaped conference, and the auditor's conference queries. The
   due rooms' timestamps are a millisecond apart, as in production (ties would make a
   claim read every tied row).

The "table seq scan" column flags a Seq Scan of a messenger table anywhere in the plan
(the catalog reads of the backlog estimate are not counted). What to expect since
migration 0009 (docs/benchmarks.md has the figures): every claim and gauge reads a
bounded number of rows whatever the backlog; the gauges' counts are capped (stuck at
1,000, the others at 10,000, the backlog estimated beyond) and republish_overdue and the
s3_down claim look at bounded windows (supervision/db/sql/queries/*.sql say which).

    .venv/bin/python bench/scale.py [--rows 1000000] [--drain 200000] [--small 10000]
    .venv/bin/python bench/scale.py --rows 1000000 --skip drain reaper   # plans only
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import re
import shutil
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import psutil
import psycopg
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import itertools

from actors.finalize.queries import FINALIZE_QUERIES
from actors.leases.lock_keeper import CycleContext
from actors.outbox.queries import OUTBOX_QUERIES
from actors.reaper.cycle import ReaperJob, run_reaper_cycle
from actors.reaper.queries import REAPER_QUERIES
from actors.reaper.recorder_signal import open_media_client
from bench._measure import tree_cpu
from bench.recording_finalize import BUCKET, RESET, SEED, rid, upload
from supervision.app.audit import audit_thresholds
from supervision.app.queries import ALL_QUERIES
from supervision.app.settings import config_from_dict
from supervision.db.database import open_database
from supervision.db.migrate import install_demo
from supervision.dev.postgres import PostgresServer
from supervision.dev.processes import start_all, stop_all
from supervision.dev.s3 import S3Server
from supervision.jobs import Job
from supervision.logs import configure_logging
from tests.chaos.daemon import Daemon, daemon_config
from tests.messenger import PREFIX

FINALIZE = {"batch_size": 100, "finalize_sla_timeout": "30m",
            "max_run_duration": "60s", "lock_ttl": "2m", "polling_interval": "1s"}
REAPER = {"batch_size": 100, "empty_room_grace": 90.0, "provision_timeout": 120.0,
          "stale_live_timeout": 14400.0}
# recording_finalize.py's rows, with every --sample-every-th Available-unpublished (not
# every 10th): their binaries must exist too, as the positive canary HEADs Done + Available
# recordings, and a million-row sample cannot be uploaded on this machine
SCALE_SEED = SEED.replace("n %% 10 = 9", "n %% %(every)s = 9")
# --spread-due: the rows fell due a millisecond apart in insertion order, as a backlog
# builds up in production, instead of all at the same instant (claims then walk the
# tables in physical order, not in random id order)
SPREAD_SEED = SCALE_SEED.replace("AS aid,", "AS aid, n,").replace(
    "'Pending', 0, now() - interval '1 second',",
    "'Pending', 0, now() - interval '1 second' - (%(rows)s - n) * interval '1 millisecond',")
assert SPREAD_SEED.count("millisecond") == 1 and "AS aid, n," in SPREAD_SEED
COUNTERS = ("messenger_recording_finalize_reconciled_total",
            "messenger_recording_finalize_failed_total",
            "messenger_recording_finalize_republished_total",
            "messenger_recording_finalize_quarantined_total")


# ------------------------------------------------------------------------------ plans


def seed(dsn: str, rows: int, every: int, spread: bool = False) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(RESET)
        conn.execute(SPREAD_SEED if spread else SCALE_SEED,
                     {"tag": "s", "rows": rows, "all_available": False, "prefix": PREFIX,
                      "every": every})
        conn.execute("VACUUM ANALYZE messenger.call_sessions, messenger.call_recordings,"
                     " messenger.recording_finalize_attempts")
        # the seed's ~1 GB of dirty pages written out now (PostgreSQL's, then the kernel's:
        # fsync is off), not by the checkpointer and the kernel's write-back during the drain
        conn.execute("CHECKPOINT")
    os.sync()


def finalize_queries() -> list[tuple[str, str, dict[str, Any]]]:
    claim = {"as_of": dt.datetime.now(dt.UTC), "batch_size": FINALIZE["batch_size"],
             "sla": 1800.0, "recheck": 1.0, "backoff_base": 0.2, "backoff_factor": 2.0,
             "backoff_cap": 1.0, "backoff_jitter": 0.1}
    return [
        ("claim_due", FINALIZE_QUERIES["finalize_attempts_claim_due"], {**claim, "s3_down": False}),
        ("claim_due s3_down", FINALIZE_QUERIES["finalize_attempts_claim_due"],
         {**claim, "s3_down": True}),
        ("known_present", FINALIZE_QUERIES["finalize_attempts_known_present"], {"limit": 3}),
        ("gauge finalize_stats", FINALIZE_QUERIES["finalize_attempts_stats"], {}),
        ("gauge slo_recordings", FINALIZE_QUERIES["slo_recordings"],
         {"sla": 1800.0, "interval": 1.0}),
        ("gauge outbox_stats", OUTBOX_QUERIES["outbox_stats"], {}),
        *audit_queries(AUDIT_RECORDINGS),
    ]


# the auditor actor's queries (`safetynet run` runs them every audit.interval) that read
# recordings, finalize rows and the outbox; the conference ones are in reaper_queries()
AUDIT_RECORDINGS = ("audit_recordings_active", "audit_recordings_terminal",
                    "audit_finalize_attempts_open", "audit_outbox_unpublished",
                    "audit_outbox_recent")
AUDIT_CONFERENCES = ("audit_conferences_active", "audit_conferences_terminal")


def audit_queries(names: tuple[str, ...]) -> list[tuple[str, str, dict[str, Any]]]:
    """The auditor's queries with the thresholds of the drain's daemon (its SLA and
    polling interval, the audit defaults)."""
    cfg = config_from_dict({
        "postgres": {"dsn": "postgresql://127.0.0.1/unused"},
        "media": {"base_url": "http://127.0.0.1:9"},
        "jobs": {"recording_finalize": {k: FINALIZE[k] for k in
                                        ("finalize_sla_timeout", "polling_interval", "lock_ttl",
                                         "max_run_duration")},
                 "conference_reaper": {"polling_interval": "1s"}}})
    params = audit_thresholds(cfg).params()
    return [(name.replace("audit_", "audit "), ALL_QUERIES[name], params) for name in names]


def reaper_queries() -> list[tuple[str, str, dict[str, Any]]]:
    now = dt.datetime.now(dt.UTC)
    out = []
    for name, window in (("empty_room", REAPER["empty_room_grace"]),
                         ("provision_timeout", REAPER["provision_timeout"]),
                         ("stale_live", REAPER["stale_live_timeout"])):
        out.append((f"claim {name}", ALL_QUERIES[f"conference_sessions_claim_{name}"],
                    {"as_of": now, "window": window, "batch_size": REAPER["batch_size"]}))
    out.append(("gauge active_backlog", REAPER_QUERIES["conference_sessions_active_backlog"],
                {k: REAPER[k] for k in ("empty_room_grace", "provision_timeout",
                                        "stale_live_timeout")}))
    out += audit_queries(AUDIT_CONFERENCES)
    return out


def explain(dsn: str, queries: list[tuple[str, str, dict[str, Any]]]
            ) -> dict[str, tuple[int, float, bool, str]]:
    """name -> (shared buffers hit+read, ms, a seq scan of a messenger table, plan text);
    writes rolled back."""
    out = {}
    with psycopg.connect(dsn) as conn:
        for name, sql, params in queries:
            with psycopg.ClientCursor(conn) as cur:
                cur.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql, params)
                plan = "\n".join(r[0] for r in cur.fetchall())
            conn.rollback()
            body = plan.split("\nPlanning")[0]
            # buffers are cumulative per node, but CTEs and InitPlans are not in their
            # parent's count: the largest node's count is a lower bound of the whole
            buffers = max((sum(int(n) for n in re.findall(r"shared (?:hit|read)=(\d+)", line))
                           for line in body.splitlines() if "Buffers:" in line), default=0)
            ms = float(re.findall(r"Execution Time: ([\d.]+) ms", plan)[0])
            seq = re.search(r"Seq Scan on (call_recordings|recording_finalize_attempts|"
                            r"call_sessions|conference_sessions) ", plan) is not None
            out[name] = (buffers, ms, seq, plan)
    return out


def plan_table(label_a: str, a: dict[str, Any], label_b: str, b: dict[str, Any]) -> list[str]:
    lines = [f"  {'query':30}{'buffers ' + label_a:>16}{'ms':>8}{'buffers ' + label_b:>18}"
             f"{'ms':>9}  table seq scan ({label_b})"]
    for name in a:
        (ba, ma, _, _), (bb, mb, seq, _) = a[name], b[name]
        lines.append(f"  {name:30}{ba:16d}{ma:8.2f}{bb:18d}{mb:9.2f}  {'yes' if seq else 'no'}")
    return lines


# ------------------------------------------------------------------------------ drain


def metrics(port: int) -> float | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            text = r.read().decode()
    except OSError:
        return None
    total = 0.0
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in COUNTERS:
            total += float(value)
    return total


class RssWatch:
    """Peak RSS of a process and of its children whose command line names the S3 worker."""

    def __init__(self, pid: int) -> None:
        self.proc = psutil.Process(pid)
        self.daemon = self.worker = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            try:
                self.daemon = max(self.daemon, self.proc.memory_info().rss)
                for child in self.proc.children(recursive=True):
                    if "actors.s3.worker" in " ".join(child.cmdline()):
                        self.worker = max(self.worker, child.memory_info().rss)
            except psutil.Error:
                pass

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def background(dsn: str) -> str:
    """What PostgreSQL does besides the daemon's statements, as ``--series`` columns:
    checkpoints completed, WAL full-page images and bytes so far, the autovacuum workers'
    tables right now."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        vacuums = [r[0].removeprefix("autovacuum: ") for r in conn.execute(
            "SELECT query FROM pg_stat_activity WHERE backend_type = 'autovacuum worker'"
            " AND query <> ''").fetchall()]
        checkpoints = conn.execute(
            "SELECT num_timed + num_requested FROM pg_stat_checkpointer").fetchone()
        wal = conn.execute("SELECT wal_fpi, wal_bytes FROM pg_stat_wal").fetchone()
    return (f"{checkpoints[0] if checkpoints else '?'},{wal[0] if wal else '?'},"
            f"{wal[1] if wal else '?'},{'; '.join(vacuums)}")


def drain(tmp: Path, pg: PostgresServer, s3: S3Server, target: int,
          series: Path | None = None) -> list[str]:
    cfg = daemon_config(pg.dsn, s3_url=s3.endpoint_url, s3=s3, bucket=BUCKET,
                        finalize=FINALIZE, reaper=False, s3_timeout="5s")
    cfg["s3"]["concurrency"] = 8
    cfg["s3"]["key_prefix"] = PREFIX
    cfg["logging"]["level"] = "warning"
    daemon = Daemon(tmp, "scale", cfg).start()
    samples: list[tuple[float, float]] = []
    activity: list[str] = []  # --series: PostgreSQL's background work at each sample
    trees = {"postgres": pg.pid, "weed": s3.pid, "daemon": daemon.pid}
    cpu: list[dict[str, float]] = []  # --series: CPU seconds of each process tree
    rss: list[tuple[float, int]] = []  # (rows done, peak RSS of both processes so far)
    watch = RssWatch(daemon.pid)
    cpu0 = None
    try:
        while daemon.alive():
            done = metrics(daemon.port)
            now = time.perf_counter()
            if done is not None:
                if cpu0 is None:
                    cpu0 = now
                samples.append((now, done))
                if series is not None:
                    activity.append(background(pg.dsn))
                    times = psutil.cpu_times()
                    cpu.append({"all": sum(times) - times.idle - times.iowait,
                                "iowait": times.iowait,
                                **{name: tree_cpu(pid) for name, pid in trees.items() if pid}})
                rss.append((done, watch.daemon + watch.worker))
                if done >= target:
                    break
            time.sleep(1.0)
    finally:
        watch.stop()
        code = daemon.terminate()
    if series is not None:
        names = sorted(cpu[0]) if cpu else []
        head = ["seconds", "rows_done", *(f"cpu_{n}" for n in names), "checkpoints",
                "wal_fpi", "wal_bytes", "autovacuum"]
        series.write_text(",".join(head) + "\n" + "".join(
            ",".join([f"{t - samples[0][0]:.2f}", f"{d:.0f}", *(f"{c[n]:.2f}" for n in names),
                      a]) + "\n"
            for (t, d), a, c in zip(samples, activity, cpu, strict=True)))
    if not samples or samples[-1][1] < target:
        return [f"daemon stopped early (exit {code}):\n{daemon.tail()}"]

    def when(n: float) -> float:  # time the counter crossed n (linear in between)
        for (t0, d0), (t1, d1) in itertools.pairwise(samples):
            if d1 >= n:
                return t0 + (t1 - t0) * ((n - d0) / (d1 - d0) if d1 > d0 else 0)
        return samples[-1][0]

    tenth = target / 10
    first = tenth / (when(tenth) - when(0.5))
    last = tenth / (when(target) - when(target - tenth))
    whole = target / (when(target) - when(0.5))
    bounds = [0.5] + [tenth * k for k in range(1, 11)]
    tenths = [tenth / (when(b) - when(a)) for a, b in itertools.pairwise(bounds)]
    peaks = [max((m for d, m in rss if d <= b), default=0) / 2**20 for b in bounds[1:]]
    return [f"drained {target} rows in {when(target) - when(0.5):.0f} s: {whole:.0f} rows/s;"
            f" first tenth {first:.0f} rows/s, last tenth {last:.0f} rows/s, last/first"
            f" {last / first:.2f} (target within 10%); load {os.getloadavg()[0]:.2f}",
            f"peak RSS: daemon {watch.daemon / 2**20:.0f} MB, S3 worker"
            f" {watch.worker / 2**20:.0f} MB, together <="
            f" {(watch.daemon + watch.worker) / 2**20:.0f} MB (target < 150 MB)",
            "rows/s by tenth: " + ", ".join(f"{r:.0f}" for r in tenths),
            "peak RSS together by the end of each tenth, MB: "
            + ", ".join(f"{m:.0f}" for m in peaks)]


# ------------------------------------------------------------------------------ reaper

REAPER_RESET = """TRUNCATE messenger.conference_participants, messenger.conference_sessions,
    messenger.integration_outbox, messenger.realtime_outbox, safetynet.conference_poison"""
REAPER_SEED = """
INSERT INTO messenger.conference_sessions (id, chat_id, deal_id, tenant_id, media_type,
    status, started_by_user_id, created_at, started_at, last_activity_at,
    active_participant_count, peak_participant_count, updated_at)
SELECT gen_random_uuid(), gen_random_uuid(), gen_random_uuid(), gen_random_uuid(), 'Video',
       CASE WHEN g <= %(due)s AND g %% 3 = 1 THEN 'Provisioning' ELSE 'Active' END,
       gen_random_uuid(), now() - interval '6 hours' - g * interval '1 ms',
       CASE WHEN g <= %(due)s AND g %% 3 = 1 THEN NULL ELSE now() - interval '5 hours' END,
       -- distinct timestamps (a millisecond apart), as in production: ties would make a
       -- claim's (last_activity_at, id) order read every tied row
       CASE WHEN g > %(due)s THEN now() - random() * interval '1 hour'  -- live, not due
            WHEN g %% 3 = 0 THEN now() - interval '10 minutes' - g * interval '1 ms'  -- empty
            ELSE now() - interval '5 hours' - g * interval '1 ms' END,  -- stale / unadmitted
       CASE WHEN g <= %(due)s AND g %% 3 = 0 THEN 0 ELSE 2 END, 4, now()
FROM generate_series(1, %(active)s) AS g
"""


async def reap_all(dsn: str) -> tuple[int, float, int]:
    cfg = config_from_dict({"postgres": {"dsn": dsn}, "media": {"base_url": "http://127.0.0.1:9"},
                            "jobs": {"conference_reaper": REAPER}})
    reaped = cycles = 0
    async with open_database(dsn, size=4) as db, open_media_client(cfg.media) as http:
        job = ReaperJob(cfg.jobs.conference_reaper, cfg.media, db, http)
        started = time.perf_counter()
        while True:
            c = await run_reaper_cycle(job, CycleContext(Job.CONFERENCE_REAPER, str(uuid.uuid4())))
            cycles += 1
            n = c.empty_timeout + c.provision_failed + c.stale_timeout
            reaped += n
            if not n:
                return reaped, time.perf_counter() - started, cycles


def reaper(dsn: str, active: int, due: int) -> tuple[dict[str, Any], str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(REAPER_RESET)
        conn.execute(REAPER_SEED, {"active": active, "due": due})
        conn.execute("VACUUM ANALYZE messenger.conference_sessions")
    plans = explain(dsn, reaper_queries())
    reaped, seconds, cycles = trio.run(reap_all, dsn)
    return plans, (f"{active} active, {due} due: reaped {reaped} in {cycles} cycles,"
                   f" {seconds:.2f} s = {1000 * seconds / max(1, reaped):.3f} ms per reaped"
                   f" conference")


# ------------------------------------------------------------------------------ main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--small", type=int, default=10_000)
    parser.add_argument("--drain", type=int, default=0, help="rows to drain (default: all)")
    parser.add_argument("--sample-every", type=int, default=500,
                        help="every Nth Uploading recording has its binary (default 500)")
    parser.add_argument("--conferences", type=int, default=100_000)
    parser.add_argument("--due", type=int, default=10_000)
    parser.add_argument("--spread-due", action="store_true",
                        help="rows due 1 ms apart in insertion order (default: all at once)")
    parser.add_argument("--skip", choices=("drain", "reaper"), nargs="*", default=[])
    parser.add_argument("--series", type=Path, help="write the drain's per-second counter"
                        " and PostgreSQL's background work (CSV) to this file")
    args = parser.parse_args()
    configure_logging("info", "json", stream=open(os.devnull, "w"))  # noqa: SIM115
    tmp = Path(tempfile.mkdtemp(prefix="bench-scale-"))
    pg, s3 = PostgresServer(tmp), S3Server(tmp)
    try:
        start_all([pg, s3])
        install_demo(pg.dsn)
        s3.create_bucket(BUCKET)
        print(f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}; rows {args.rows},"
              f" small {args.small}, drain {args.drain or args.rows}", flush=True)
        seed(pg.dsn, args.small, args.sample_every, args.spread_due)
        small = explain(pg.dsn, finalize_queries())
        started = time.perf_counter()
        seed(pg.dsn, args.rows, args.sample_every, args.spread_due)
        print(f"seeded {args.rows} rows set-based (with VACUUM ANALYZE) in"
              f" {time.perf_counter() - started:.0f} s", flush=True)
        large = explain(pg.dsn, finalize_queries())
        print("recording-finalize queries, EXPLAIN (ANALYZE, BUFFERS), shared buffers hit+read"
              " of the largest node (a lower bound; CTE and InitPlan counts are separate):")
        print("\n".join(plan_table(str(args.small), small, str(args.rows), large)))
        for name, (_, _, _, plan) in large.items():
            print(f"\n--- {name} at {args.rows} rows\n{plan}")
        if "drain" not in args.skip:
            every = args.sample_every  # present: n % every == 0; Available: == 9
            sample = [f"{PREFIX}{rid('s', n)}" for n in range(args.rows)
                      if n % every in (0, 9)]
            trio.run(upload, s3, sample, 32)
            print(f"\nuploaded {len(sample)} binaries; draining with `safetynet run`", flush=True)
            print("\n".join(drain(tmp, pg, s3, args.drain or args.rows, args.series)), flush=True)
        if "reaper" not in args.skip:
            plans_a, line_a = reaper(pg.dsn, args.due, args.due)
            plans_b, line_b = reaper(pg.dsn, args.conferences, args.due)
            print(f"\nconference-reaper: {line_a}\n  {line_b}")
            print("\n".join(plan_table(f"{args.due // 1000}k", plans_a,
                                       f"{args.conferences // 1000}k", plans_b)))
            for name, (_, _, _, plan) in plans_b.items():
                print(f"\n--- {name} at {args.conferences} active\n{plan}")
    finally:
        stop_all([pg, s3])
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
