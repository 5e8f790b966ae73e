"""The relay before the pipeline split (the parent of 46b2891, "Relay as a pipeline"), run
beside today's relay by ``bench/outbox_relay.py --before-split`` (not a benchmark itself).

Its code is exported with ``git archive`` into a temp dir and run there, in a subprocess
of the current venv with ``PYTHONPATH`` at that tree, so each drain runs its own relay.
It predates migrations 0014 to 0018 and the current module layout, so it gets a database of
its own on the same PostgreSQL server (:data:`DATABASE`), set up by its own
``install_demo`` (its messenger fixture and its migrations 0001 to 0013, on the
bench's own connection; they create no role, so nothing is shared with today's database but
the server). The outbox table's columns are the same, so the parent writes the same rows
into it, in the same shapes, as for today's relay.

A drain is ``run_once(cfg, "outbox-relay")`` in the subprocess, as its own bench ran it;
the subprocess times it (wall, and its own CPU by ``time.process_time()``) after its
imports, and the parent's :class:`~bench._measure.CpuMeter` around the subprocess gives
the servers' CPU (the imports do not touch them).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

COMMIT = "46b2891^"
DATABASE = "bench_before_split"
ROOT = Path(__file__).resolve().parents[1]

MIGRATE = "import sys; from supervision.migrate import install_demo; install_demo(sys.argv[1])"

DRAIN = """
import gc, json, os, sys, time
import trio
from supervision.app.daemon import run_once
from supervision.config import config_from_dict
from supervision.logs import configure_logging

dsn, bootstrap = sys.argv[1], sys.argv[2]
configure_logging("info", "json", stream=open(os.devnull, "w"))
cfg = config_from_dict({
    "postgres": {"dsn": dsn},
    "kafka": {"bootstrap_servers": bootstrap, "client_id": "bench-relay"},
    "outbox_relay": {"batch_size": 500, "poll_interval": "1s"},
})
gc.freeze()
cpu, wall = time.process_time(), time.perf_counter()
counts = trio.run(run_once, cfg, "outbox-relay")
wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
print(json.dumps({"seconds": wall, "python_cpu": cpu, "counts": counts}, default=str))
"""


class BeforeSplit:
    """The exported tree and its database; :meth:`drain` runs one drain of its relay."""

    def __init__(self, server_dsn: str, base_dir: Path) -> None:
        self.tree = base_dir / "before-split"
        self.tree.mkdir()
        done = subprocess.run(["git", "-C", str(ROOT), "archive", COMMIT],
                              capture_output=True)
        if done.returncode:
            raise SystemExit(f"--before-split exports {COMMIT} with git archive, which needs"
                             f" this repository's history: {done.stderr.decode()[-300:]}")
        archive = done.stdout
        subprocess.run(["tar", "-x", "-C", str(self.tree)], input=archive, check=True)
        with psycopg.connect(server_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DATABASE)))
        self.dsn = make_conninfo(server_dsn, dbname=DATABASE)
        self._python(MIGRATE, self.dsn)

    def _python(self, code: str, *args: str) -> str:
        done = subprocess.run([sys.executable, "-c", code, *args], cwd=self.tree,
                              env={**os.environ, "PYTHONPATH": str(self.tree)},
                              capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"the relay before the split failed: {done.stderr[-2000:]}")
        return done.stdout

    def drain(self, bootstrap: str) -> dict[str, Any]:
        """``{"seconds", "python_cpu", "counts"}`` of one ``run_once`` drain."""
        out = self._python(DRAIN, self.dsn, bootstrap)
        result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
        return result
