"""How much CPU does a running daemon spend per finalized row, and when nothing is due? (issue 15)

A benchmark (not a test). It starts PostgreSQL, SeaweedFS and Tansu (``supervision.dev.
stack``, in a temp dir) and real ``python -m supervision.app run`` processes, and reads
their CPU with psutil (user + system, from ``/proc``); this process's own CPU (seeding,
polling the database) is not counted.

  drain   one daemon (recording-finalize every 1 s, batch 100, s3.concurrency 8,
          the relay off so that only the finalize work is
          measured; leases and fencing as in production). Each round seeds ``--rows`` due
          rows set-based, 70% with the binary in SeaweedFS (reconciled), 20% without
          (Failed/Timeout), 10% Available-unpublished (republished) — the mix of
          ``bench/recording_finalize.py`` — and measures from the seed's commit until
          every finalize row is Done: CPU ms per row of the daemon process and of its S3
          worker process separately, rows/s (it includes up to one polling interval
          before the first claim), and the cores PostgreSQL and weed used alongside.
  idle    another daemon with the production defaults (every job enabled, the relay
          publishing to Tansu, default polling intervals) and an empty backlog: after a
          warm-up (``--warmup`` s: connections, the first cycles, the S3 worker started),
          ``--idle-rounds`` windows of ``--idle-seconds`` each; CPU % of one core of the
          daemon and of its S3 worker (target < 1% together).

Run:

    .venv/bin/python bench/cpu_per_row.py [--rows 5000] [--rounds 3] [--idle-seconds 60]
        [--profile]   # py-spy (if installed) samples the daemon and its S3 worker
                      # during one extra drain (raw stacks kept in $TMPDIR)
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
import psycopg
import tomli_w
import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._measure import PY_SPY, py_spy_available, spread, tree_cpu  # noqa: E402
from bench.recording_finalize import (  # noqa: E402
    BUCKET,
    db_state,
    kind,
    rid,
    seed,
    upload,
)
from supervision.db.migrate import install_demo  # noqa: E402
from supervision.dev.kafka import KafkaServer  # noqa: E402
from supervision.dev.ports import free_ports  # noqa: E402
from supervision.dev.postgres import PostgresServer  # noqa: E402
from supervision.dev.processes import start_all, stop_all  # noqa: E402
from supervision.dev.s3 import S3Server  # noqa: E402
from tests.messenger import PREFIX  # noqa: E402

WORKER = "actors.s3.worker"


def daemon_config(pg: PostgresServer, s3: S3Server, kafka: KafkaServer, port: int,
                  drain: bool, rows: int) -> dict[str, Any]:
    creds = s3.credentials
    raw: dict[str, Any] = {
        "postgres": {"dsn": pg.dsn},
        "s3": {"endpoint_url": s3.endpoint_url, "bucket": BUCKET, "key_prefix": PREFIX,
               "access_key_id": creds.access_key_id,
               "secret_access_key": creds.secret_access_key, "region": creds.region,
               "concurrency": 8},
        "kafka": {"bootstrap_servers": kafka.bootstrap_servers},
        "http": {"listen": f"127.0.0.1:{port}"},
        "logging": {"format": "json", "level": "info"},
    }
    if drain:
        raw["jobs"] = {"recording_finalize": {
            "polling_interval": "1s", "batch_size": 100,
            "max_run_duration": "10m", "lock_ttl": "11m"},
            "conference_reaper": {"enabled": False}}
        raw["outbox_relay"] = {"enabled": False}
    return raw


class Daemon:
    """One ``safetynet run`` process; its log goes to a file."""

    def __init__(self, base_dir: Path, name: str, config: dict[str, Any], port: int) -> None:
        path = base_dir / f"{name}.toml"
        path.write_text(tomli_w.dumps(config))
        self.url = f"http://127.0.0.1:{port}"
        self.log = (base_dir / f"{name}.log").open("wb")
        env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "supervision.app", "run", "-c", str(path)],
            cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        self.process = psutil.Process(self.proc.pid)

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/readyz", timeout=1).status_code == 200:
                    return
            if self.proc.poll() is not None:
                raise RuntimeError(f"daemon exited {self.proc.returncode}")
            time.sleep(0.2)
        raise RuntimeError("daemon not ready")

    def worker(self) -> psutil.Process | None:
        for child in self.process.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if WORKER in " ".join(child.cmdline()):
                    return child
        return None

    def cpu(self) -> dict[str, float]:
        """CPU seconds so far: the daemon process, its S3 worker (0 when none runs)."""
        t = self.process.cpu_times()
        out = {"daemon": t.user + t.system, "worker": 0.0}
        worker = self.worker()
        if worker is not None:
            with contextlib.suppress(psutil.Error):
                w = worker.cpu_times()
                out["worker"] = w.user + w.system
        return out

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.log.close()


def server_cpu(pid: int | None) -> float:
    return tree_cpu(pid) if pid else 0.0


def done_rows(dsn: str) -> int:
    return db_state(dsn)[2]


def drain_round(daemon: Daemon, dsn: str, rows: int, servers: dict[str, int | None],
                timeout: float = 600) -> dict[str, float]:
    worker_before = daemon.worker()
    seed(dsn, "m", rows, all_available=False)
    c0 = daemon.cpu()
    s0 = {name: server_cpu(pid) for name, pid in servers.items()}
    t0 = time.perf_counter()
    with psycopg.connect(dsn, autocommit=True) as conn:
        deadline = time.monotonic() + timeout
        while True:
            row = conn.execute("SELECT count(*) FROM messenger.recording_finalize_attempts"
                               " WHERE status = 'Done'").fetchone()
            if row and row[0] >= rows:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"drain stuck at {row}")
            time.sleep(0.05)
    wall = time.perf_counter() - t0
    c1 = daemon.cpu()
    s1 = {name: server_cpu(pid) for name, pid in servers.items()}
    if worker_before is None or daemon.worker() is None \
            or daemon.worker().pid != worker_before.pid:  # type: ignore[union-attr]
        raise RuntimeError("the S3 worker was (re)started during the round")
    missing = sum(1 for n in range(rows) if kind(n) == "missing")
    state = db_state(dsn)
    assert state[:3] == (rows - missing, missing, rows), state
    return {"wall": wall, "rate": rows / wall,
            "daemon": 1000 * (c1["daemon"] - c0["daemon"]) / rows,
            "worker": 1000 * (c1["worker"] - c0["worker"]) / rows,
            **{f"{name}_cores": (s1[name] - s0[name]) / wall for name in servers}}


def idle_windows(daemon: Daemon, seconds: float, rounds: int) -> list[dict[str, float]]:
    out = []
    for _ in range(rounds):
        c0, t0 = daemon.cpu(), time.perf_counter()
        time.sleep(seconds)
        c1, wall = daemon.cpu(), time.perf_counter() - t0
        out.append({name: 100 * (c1[name] - c0[name]) / wall for name in c0})
    return out


def profile_drain(daemon: Daemon, dsn: str, rows: int, servers: dict[str, int | None],
                  out: Path, worker_out: Path) -> None:
    """py-spy the daemon (GIL-holding samples) into *out* and its S3 worker (one thread,
    on-CPU samples) into *worker_out* during one drain."""
    exe = str(PY_SPY) if PY_SPY.exists() else shutil.which("py-spy") or "py-spy"
    worker = daemon.worker()
    targets = [(daemon.proc.pid, out, ["--threads", "--gil"])]
    if worker is not None:
        targets.append((worker.pid, worker_out, []))
    spies = [subprocess.Popen(
        [exe, "record", "--pid", str(pid), "--rate", "400", "--format", "raw", *flags,
         "--nonblocking", "--duration", "900", "-o", str(path)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        for pid, path, flags in targets]
    time.sleep(1)
    try:
        drain_round(daemon, dsn, rows, servers)
    finally:
        for spy in spies:
            spy.send_signal(signal.SIGINT)
        for spy in spies:
            spy.communicate(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=5000, help="rows per drain (5000)")
    parser.add_argument("--rounds", type=int, default=3, help="drain rounds (3)")
    parser.add_argument("--idle-seconds", type=float, default=60.0, help="per window (60)")
    parser.add_argument("--idle-rounds", type=int, default=3, help="idle windows (3)")
    parser.add_argument("--warmup", type=float, default=15.0, help="idle warm-up s (15)")
    parser.add_argument("--skip-idle", action="store_true")
    parser.add_argument("--skip-drain", action="store_true")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (logs)")
    parser.add_argument("--profile", action="store_true",
                        help="py-spy the daemon during one extra drain (raw file kept)")
    args = parser.parse_args()
    base_dir = Path(tempfile.mkdtemp(prefix="bench-cpu-"))
    pg, s3, kafka = PostgresServer(base_dir), S3Server(base_dir), KafkaServer(base_dir)
    daemons: list[Daemon] = []
    try:
        start_all([pg, s3, kafka])
        install_demo(pg.dsn)
        s3.create_bucket(BUCKET)
        rows = args.rows
        present = [f"{PREFIX}{rid('m', n)}" for n in range(rows) if kind(n) == "present"]
        trio.run(upload, s3, present)
        servers = {"postgres": pg.pid, "weed": s3.pid}
        print(f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f} | rows={rows}"
              f" (70/20/10) rounds={args.rounds} | idle {args.idle_rounds} x"
              f" {args.idle_seconds:.0f} s")
        if not args.skip_drain:
            port = free_ports(1)[0]
            daemon = Daemon(base_dir, "drain", daemon_config(pg, s3, kafka, port, True, rows),
                            port)
            daemons.append(daemon)
            daemon.wait_ready()
            deadline = time.monotonic() + 30
            while daemon.worker() is None and time.monotonic() < deadline:
                time.sleep(0.1)  # the first cycle's probe starts it
            results = []
            for n in range(args.rounds):
                results.append(drain_round(daemon, pg.dsn, rows, servers))
                r = results[-1]
                print(f"  drain round {n + 1}: {r['wall']:.2f} s, {r['rate']:.0f} rows/s;"
                      f" CPU ms per row: daemon {r['daemon']:.3f}, S3 worker"
                      f" {r['worker']:.3f}, together {r['daemon'] + r['worker']:.3f};"
                      f" cores postgres {r['postgres_cores']:.2f} weed"
                      f" {r['weed_cores']:.2f}; load {os.getloadavg()[0]:.2f}", flush=True)
            ms = "{:.3f}"
            print(f"drain CPU ms per row: daemon {spread([r['daemon'] for r in results], ms)};"
                  f" S3 worker {spread([r['worker'] for r in results], '{:.3f}')}; together"
                  f" {spread([r['daemon'] + r['worker'] for r in results], '{:.3f}')};"
                  f" rows/s {spread([r['rate'] for r in results])}")
            if args.profile and py_spy_available():
                raw, raw_worker = base_dir / "py-spy.txt", base_dir / "py-spy-worker.txt"
                profile_drain(daemon, pg.dsn, rows, servers, raw, raw_worker)
                kept = Path(tempfile.gettempdir()) / "bench-cpu-py-spy.txt"
                kept_worker = Path(tempfile.gettempdir()) / "bench-cpu-py-spy-worker.txt"
                shutil.copy(raw, kept)
                if raw_worker.exists():
                    shutil.copy(raw_worker, kept_worker)
                print(f"py-spy raw samples during one more drain: daemon {kept},"
                      f" S3 worker {kept_worker}")
            daemon.stop()
            seed(pg.dsn, "m", 0, all_available=False)  # empty backlog for the idle daemon
        if not args.skip_idle:
            port = free_ports(1)[0]
            daemon = Daemon(base_dir, "idle", daemon_config(pg, s3, kafka, port, False, rows),
                            port)
            daemons.append(daemon)
            daemon.wait_ready()
            time.sleep(args.warmup)
            windows = idle_windows(daemon, args.idle_seconds, args.idle_rounds)
            for n, w in enumerate(windows, 1):
                print(f"  idle window {n}: daemon {w['daemon']:.2f}% S3 worker"
                      f" {w['worker']:.2f}% of a core; load {os.getloadavg()[0]:.2f}")
            total = [w["daemon"] + w["worker"] for w in windows]
            ok = {True: "ok", False: "MISSED"}
            pct = "{:.2f}"
            print(f"idle CPU % of one core: daemon {spread([w['daemon'] for w in windows], pct)};"
                  f" S3 worker {spread([w['worker'] for w in windows], '{:.2f}')};"
                  f" together {spread(total, '{:.2f}')}  target < 1%:"
                  f" {ok[statistics.median(total) < 1]}")
    finally:
        for daemon in daemons:
            daemon.stop()
        stop_all([pg, s3, kafka])
        if args.keep:
            print(f"logs kept in {base_dir}")
        else:
            shutil.rmtree(base_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
