"""Does the mixed drain reach s3.concurrency / latency when S3 is slow? (issue 15, item 1)

A benchmark (not a test). SeaweedFS answers a HEAD in ~0.3 ms; real object storage in
10-50 ms. Here the fault proxy (``tests/faults.py``, HTTP mode, in a process of its own
so it does not share this process's GIL) holds every S3 answer until ``latency`` (plus a
uniform draw from ``[-jitter, +jitter]``) after its request arrived (``HttpRule.hold``:
the request is forwarded at once, so SeaweedFS's own time and the proxy's forwarding are
inside the latency, as in a store that answers in ``latency``). Then the drain is bound
by the connections, not the CPU: its limit is ``s3.concurrency / latency`` HEAD/s
(400 at 8 connections and 20 ms). For each setting (s3.concurrency x latency), each round:

  raw pycurl    the same HEADs through the same proxy from libcurl's multi interface in
                this process (``actors.s3.worker.CurlPool``: no pipe, no daemon) at the
                same concurrency: what the proxy + the store deliver at best (on 2 shared
                cores a Python proxy may itself be the limit at 64 x 20 ms = 3,200 req/s).
  S3 worker     the same HEADs through ``open_object_store`` (the S3 worker process) from
                ``pool_size(concurrency)`` Trio tasks, no database.
  drain         the mixed workload of ``bench/recording_finalize.py`` (70% present, 20%
                missing, 10% Available-unpublished; 90% need a HEAD), drained in-process
                (``run_finalize_cycle`` on ``open_resources`` until a cycle finds nothing
                due), at the default settings (no cap on Missing verdicts since issue
                25: each has its evidence, the objects found in the same cycle).

The drain sets ``batch_size`` to max(100, 2 x pool_size(c)) (256 at c=64), as
docs/configuration.md advises for high concurrency, so the printed "claims" column counts
claims of that size.

Ratios: drain HEAD/s over the limit (target >= 0.9), over raw pycurl, over the S3 worker.
And where the drain's time went: before its first HEAD (cycle start: clock, probe,
canaries), after its last answer (last commits, gauges, the empty cycle that ends the
drain), and between them the time with fewer than ``s3.concurrency`` HEADs outstanding
from the reconciler pool (the S3 worker then has idle connections), split by whether the
claimer was inside its claim transaction; the committers' busy share; the HEAD latency
seen by the reconcilers (worker queue + wire). Per setting, the proxy reports how late
its held answers went out (mean, p50, p99 over every request of the setting): the store
it emulates answers in ``latency`` plus that, so a late proxy (a saturated machine)
lowers the reachable rate below the nominal limit for every client alike.

Rows per drain: enough for ``--seconds`` at the limit (at least 2,000). It starts its own
PostgreSQL and SeaweedFS (``supervision.dev.stack``, in a temp dir) and always stops them.

    .venv/bin/python bench/latency_drain.py [--rounds 3] [--seconds 8] [--concurrency 8 64]
"""

from __future__ import annotations

import argparse
import os
import select
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import attrs
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from actors.finalize.reconciler import pool_size
from actors.s3.process import open_object_store
from actors.s3.wire import decode_settings, encode_settings
from actors.s3.worker import CurlPool
from bench._measure import CpuMeter, TimedDatabase, percentile, spread
from bench.recording_finalize import (
    BUCKET,
    COMMIT_FNS,
    drain,
    for_each,
    kind,
    make_config,
    rid,
    seed,
    upload,
)
from supervision.app.settings import Config
from supervision.db.migrate import install_demo
from supervision.dev.postgres import PostgresServer
from supervision.dev.processes import start_all, stop_all
from supervision.dev.s3 import S3Server
from supervision.logs import configure_logging
from tests.messenger import PREFIX

COMMITTERS = 2


# ------------------------------------------------------------------------------ proxy


def serve_proxy(upstream_port: int, latency: float, jitter: float) -> None:
    """The proxy process: print the port, relay until stdin closes."""
    from tests.faults import FaultProxy, HttpRule

    async def main() -> None:
        proxy = FaultProxy("127.0.0.1", upstream_port, http=True)
        proxy.rules.append(HttpRule(lambda _req: True, latency=latency, jitter=jitter,
                                       hold=True))
        async with trio.open_nursery() as nursery:
            await nursery.start(proxy.serve)
            print(proxy.port, flush=True)
            await trio.lowlevel.wait_readable(sys.stdin.fileno())
            late = proxy.held or [0.0]
            print(f"{1000 * statistics.fmean(late):.3f} {1000 * percentile(late, 0.5):.3f}"
                  f" {1000 * percentile(late, 0.99):.3f}", flush=True)
            nursery.cancel_scope.cancel()

    trio.run(main)


class ProxyProcess:
    def __init__(self, upstream_port: int, latency: float, jitter: float) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--serve-proxy", str(upstream_port), str(latency),
             str(jitter)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], 20)
        assert ready, "proxy did not start"
        self.port = int(self.proc.stdout.readline())

    def stop(self) -> tuple[float, ...] | None:
        """Stop the proxy; how late its held answers went out (ms: mean, p50, p99)."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.close()
        try:
            late = tuple(float(x) for x in self.proc.stdout.readline().split()) or None
            self.proc.wait(10)
        except (subprocess.TimeoutExpired, ValueError):
            self.proc.kill()
            self.proc.wait()
            return None
        return late


# ------------------------------------------------------------------------------ baselines


def raw_pycurl(cfg: Config, recording_ids: list[str]) -> float:
    """HEAD/s of libcurl's multi interface alone, s3.concurrency on the wire."""
    pool = CurlPool(decode_settings(encode_settings(cfg.s3, _credentials(cfg))))
    for n, r in enumerate(recording_ids):
        pool.submit(n, "object", r)
    answers = 0
    started = time.perf_counter()
    while answers < len(recording_ids):
        answers += len(pool.step())
        if answers < len(recording_ids):
            pool.wait(None)
    return len(recording_ids) / (time.perf_counter() - started)


def _credentials(cfg: Config) -> Any:
    from actors.s3.wire import Credentials
    return Credentials(cfg.s3.access_key_id, cfg.s3.secret_access_key)


async def worker_ceiling(cfg: Config, recording_ids: list[str]) -> float:
    async with open_object_store(cfg.s3) as store:
        await store.head_bucket()
        return len(recording_ids) / await for_each(
            recording_ids, pool_size(cfg.s3.concurrency), store.head_recording)


# ------------------------------------------------------------------------------ the drain


@attrs.define
class Timeline:
    """HEADs outstanding from the reconciler pool over time, and the claimer's state."""

    concurrency: int
    inflight: int = 0
    last: float = 0.0
    first_sent: float | None = None
    last_answer: float = 0.0
    heads: int = 0
    latency: float = 0.0
    short: float = 0.0           # time with fewer than `concurrency` HEADs outstanding
    short_claiming: float = 0.0  # ... of it while the claimer was in claim_due
    claiming: bool = False
    began: float = 0.0

    def _advance(self) -> None:
        now = time.perf_counter()
        if self.first_sent is not None and self.inflight < self.concurrency:
            self.short += now - self.last
            if self.claiming:
                self.short_claiming += now - self.last
        self.last = now

    def set_claiming(self, value: bool) -> None:
        self._advance()
        self.claiming = value


class TimedStore:
    def __init__(self, store: Any, timeline: Timeline) -> None:
        self._store = store
        self.t = timeline

    async def head_bucket(self) -> Any:
        return await self._store.head_bucket()

    async def probe(self) -> Any:
        return await self._store.probe()

    async def list_recordings(self) -> Any:
        return await self._store.list_recordings()

    async def head_recording(self, recording_id: str) -> Any:
        t = self.t
        t._advance()
        if t.first_sent is None:
            t.first_sent = t.last
        t.inflight += 1
        started = t.last
        try:
            return await self._store.head_recording(recording_id)
        finally:
            t._advance()
            t.inflight -= 1
            t.heads += 1
            t.latency += t.last - started
            t.last_answer = t.last
            # the tail after the last answer is counted apart, not as "short"


class ClaimTimedDatabase(TimedDatabase):
    def __init__(self, db: Any, timeline: Timeline) -> None:
        super().__init__(db)
        self.timeline = timeline

    async def atomic(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        claim = getattr(fn, "__name__", "") == "claim_due"
        if claim:
            self.timeline.set_claiming(True)
        try:
            return await super().atomic(fn, *args, **kwargs)
        finally:
            if claim:
                self.timeline.set_claiming(False)


async def timed_drain(cfg: Config) -> tuple[float, Timeline, TimedDatabase, int]:
    timeline = Timeline(cfg.s3.concurrency)
    timed: list[TimedDatabase] = []

    def wrap_db(db: Any) -> TimedDatabase:
        timed.append(ClaimTimedDatabase(db, timeline))
        return timed[-1]

    def wrap_store(store: Any) -> TimedStore:
        timeline.began = time.perf_counter()  # drain() starts its clock right after
        return TimedStore(store, timeline)

    seconds, _counts, cycles, _ = await drain(cfg, wrap_db, wrap_store)
    return seconds, timeline, timed[0], cycles


def drain_round(cfg: Config, servers: dict[str, int | None], rows: int, heads: list[str],
                nominal: float) -> dict[str, Any]:
    seed(cfg.postgres.dsn.reveal(), "m", rows, all_available=False)
    meter = CpuMeter(servers)
    with meter.measure():
        seconds, t, timed, cycles = trio.run(timed_drain, cfg)
    assert t.heads >= len(heads), (t.heads, len(heads))  # + the canaries
    head_rate = len(heads) / seconds
    before = (t.first_sent or t.began) - t.began
    tail = max(0.0, t.began + seconds - t.last_answer)
    # the "short" time up to the last answer (the tail is not counted in it)
    commit = sum(v[1] for n, v in timed.stats.items()
                 if n in COMMIT_FNS or n.endswith("(group)"))
    claims = timed.stats["claim_due"]
    steady = len(heads) / max(1e-9, t.last_answer - (t.first_sent or t.began))
    return {"seconds": seconds, "head_rate": head_rate, "ratio": head_rate / nominal,
            "steady": steady,
            "before": before, "tail": tail, "short": t.short,
            "short_claiming": t.short_claiming, "cycles": cycles,
            "claims": int(claims[0]), "claim_ms": 1000 * claims[1] / max(1, claims[0]),
            "committers_busy": commit / (COMMITTERS * seconds),
            "latency_ms": 1000 * t.latency / max(1, t.heads), "cores": meter.cores(),
            "cpu": meter}


# ------------------------------------------------------------------------------ rounds


def run_setting(base: Config, s3: S3Server, servers: dict[str, int | None], concurrency: int,
                latency: float, jitter: float, rounds: int, seconds: float,
                uploaded: int) -> dict[str, Any]:
    nominal = concurrency / latency
    rows = max(2000, round(nominal * seconds / 0.9 / 10) * 10)
    rows = min(rows, uploaded)
    heads = [rid("m", n) for n in range(rows) if kind(n) != "available"]
    proxy = ProxyProcess(urlsplit(s3.endpoint_url).port or 0, latency, jitter)
    try:
        rf = base.jobs.recording_finalize
        rf = attrs.evolve(rf, batch_size=max(rf.batch_size, 2 * pool_size(concurrency)))
        cfg = attrs.evolve(base, s3=attrs.evolve(
            base.s3, endpoint_url=f"http://127.0.0.1:{proxy.port}", concurrency=concurrency),
            jobs=attrs.evolve(base.jobs, recording_finalize=rf))
        meters = {**servers, "proxy": proxy.proc.pid}
        results = []
        for _ in range(rounds):
            raw = raw_pycurl(cfg, heads[: max(500, len(heads) // 2)])
            worker = trio.run(worker_ceiling, cfg, heads[: max(500, len(heads) // 2)])
            d = drain_round(cfg, meters, rows, heads, nominal)
            d.update(raw=raw, worker=worker, load=os.getloadavg()[0])
            results.append(d)
            print(f"  s3.concurrency {concurrency}, {1000 * latency:.0f}±{1000 * jitter:.0f}"
                  f" ms: round done, load {d['load']:.2f}", file=sys.stderr)
    finally:
        late = proxy.stop()
    return {"concurrency": concurrency, "latency": latency, "jitter": jitter, "rows": rows,
            "heads": len(heads), "nominal": nominal, "rounds": results, "late": late}


def report(s: dict[str, Any]) -> list[str]:
    c, lat, jit = s["concurrency"], s["latency"], s["jitter"]
    rs = s["rounds"]
    lines = [f"\ns3.concurrency {c}, latency {1000 * lat:.0f} ms ± {1000 * jit:.0f}:"
             f" limit {s['nominal']:.0f} HEAD/s; {s['rows']} rows, {s['heads']} HEADs",
             f"  {'round':6}{'raw curl':>9}{'worker':>8}{'drain':>7}{' /limit':>7}"
             f"{' /raw':>6}{' /wrk':>6}{'drain s':>8}{'before':>7}{'short':>7}"
             f"{'(claim)':>8}{'tail':>6}{'steady':>7}{'cycles':>7}{'claims':>7}{'ms/claim':>9}"
             f"{'commit%':>8}{'HEAD ms':>8}{'cores':>6}{'load':>6}"]
    for n, r in enumerate(rs, 1):
        lines.append(
            f"  {n:<6}{r['raw']:9.0f}{r['worker']:8.0f}{r['head_rate']:7.0f}{r['ratio']:7.2f}"
            f"{r['head_rate'] / r['raw']:6.2f}{r['head_rate'] / r['worker']:6.2f}"
            f"{r['seconds']:8.2f}{r['before']:7.2f}{r['short']:7.2f}{r['short_claiming']:8.2f}"
            f"{r['tail']:6.2f}{r['steady']:7.0f}{r['cycles']:7d}{r['claims']:7d}{r['claim_ms']:9.1f}"
            f"{100 * r['committers_busy']:7.0f}%{r['latency_ms']:8.1f}{r['cores']:6.2f}"
            f"{r['load']:6.2f}")
    lines.append("  CPU ms per row in the drain: " + "; ".join(
        r["cpu"].per_item(s["rows"], ("python", "children", "postgres", "weed", "proxy"))
        .replace("children", "s3-worker") for r in rs))
    if s["late"]:
        lines.append("  the proxy's held answers went out late by (ms, every request of the"
                     " setting): mean {:.2f}, p50 {:.2f}, p99 {:.2f}".format(*s["late"]))
    ratio = [r["ratio"] for r in rs]
    lines.append(f"  drain / limit {spread(ratio, '{:.2f}')} (target >= 0.9:"
                 f" {'ok' if statistics.median(ratio) >= 0.9 else 'MISSED'});"
                 f" steady / limit {spread([r['steady'] / s['nominal'] for r in rs], '{:.2f}')};"
                 f" drain / raw pycurl {spread([r['head_rate'] / r['raw'] for r in rs], '{:.2f}')};"
                 f" raw pycurl / limit {spread([r['raw'] / s['nominal'] for r in rs], '{:.2f}')}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=8.0,
                        help="drain length at the limit, sets the rows (default 8)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--latency", type=float, nargs="+", default=[0.02, 0.05],
                        help="seconds (default 0.02 0.05)")
    parser.add_argument("--jitter", type=float, nargs="+", default=[0.0, 0.02],
                        help="± seconds, one per --latency (default 0 0.02)")
    parser.add_argument("--serve-proxy", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_proxy:
        port, latency, jitter = args.serve_proxy
        serve_proxy(int(port), float(latency), float(jitter))
        return
    configure_logging("info", "json", stream=open(os.devnull, "w"))  # noqa: SIM115
    base_dir = Path(tempfile.mkdtemp(prefix="bench-latency-"))
    pg, s3 = PostgresServer(base_dir), S3Server(base_dir)
    try:
        start_all([pg, s3])
        install_demo(pg.dsn)
        s3.create_bucket(BUCKET)
        base = make_config(pg.dsn, s3)
        settings = [(c, lat, jit) for lat, jit in zip(args.latency, args.jitter, strict=True)
                    for c in args.concurrency]
        most = max(max(2000, round(c / lat * args.seconds / 0.9 / 10) * 10)
                   for c, lat, _ in settings)
        present = [f"{PREFIX}{rid('m', n)}" for n in range(most) if kind(n) == "present"]
        upload_s = trio.run(upload, s3, present, 64)
        print(f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f} | rounds={args.rounds}"
              f" | batch_size max({base.jobs.recording_finalize.batch_size}, 2 x pool_size(c)),"
              " 2 committers,"
              f" pool_size(c) = {pool_size(1)} x c |"
              f" {len(present)} objects uploaded ({len(present) / upload_s:.0f} PUT/s)")
        print("columns: raw curl / worker / drain = HEAD/s; before = s until the drain's"
              " first HEAD; short = s with < s3.concurrency HEADs outstanding from the pool"
              " (claim) = of it while claiming; tail = s after the last answer;"
              " steady = HEAD/s from the first HEAD to"
              " the last answer; commit% ="
              " committers' time in their calls / 2; HEAD ms = seen by the reconcilers")
        servers = {"postgres": pg.pid, "weed": s3.pid}
        for c, lat, jit in settings:
            result = run_setting(base, s3, servers, c, lat, jit, args.rounds, args.seconds,
                                 most)
            print("\n".join(report(result)), flush=True)
    finally:
        stop_all([pg, s3])
        shutil.rmtree(base_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
