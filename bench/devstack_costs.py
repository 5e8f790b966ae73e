"""What does the dev stack's SCRAM setting save? (issue 29, the suite's CPU)

A benchmark (not a test). The test suite is CPU-bound on two cores and opens about 6,000
PostgreSQL connections; each authenticates with SCRAM, whose client and server derive
keys through ``scram_iterations`` rounds of HMAC. The embedded server hashes passwords
with ``DEV_SCRAM_ITERATIONS``; the baseline is a role of the same server whose password
was hashed with PostgreSQL's default 4,096 (``SET scram_iterations`` before ``CREATE
ROLE``). Both log in and run ``SELECT 1``, alternately, ``--connections`` times a round.
Reported per round: CPU per connection of both sides (the client's own, the server's
process tree), the wall time, and the CPU ratio to the baseline.

    .venv/bin/python bench/devstack_costs.py [--rounds 3] [--connections 300]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psycopg
from psycopg import sql

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _measure import tree_cpu

from supervision.dev.postgres import DEV_SCRAM_ITERATIONS, PostgresServer

DEFAULT_ITERATIONS = 4096  # PostgreSQL's own scram_iterations


def _own_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def cost(server_pid: int, n: int, op: Callable[[int], None]) -> tuple[float, float, float]:
    """Milliseconds per operation: client CPU, server CPU, wall."""
    c0, s0, t0 = _own_cpu(), tree_cpu(server_pid), time.monotonic()
    for i in range(n):
        op(i)
    return ((_own_cpu() - c0) / n * 1000, (tree_cpu(server_pid) - s0) / n * 1000,
            (time.monotonic() - t0) / n * 1000)


def connections(pg: PostgresServer, rounds: int, n: int) -> None:
    roles = {"dev": DEV_SCRAM_ITERATIONS, "default": DEFAULT_ITERATIONS}
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        for role, iterations in roles.items():
            conn.execute(sql.SQL("SET scram_iterations = {}").format(sql.Literal(iterations)))
            conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))
            conn.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                sql.Identifier(role), sql.Literal(f"{role}-password")))
    dsn = {role: pg.dsn.replace(f"postgres:{pg.password}", f"{role}:{role}-password")
           for role in roles}
    assert pg.pid is not None
    print(f"PostgreSQL connection + SELECT 1, {n} a round (ms of CPU per connection)")
    for r in range(rounds):
        got = {}
        for role in (("dev", "default") if r % 2 == 0 else ("default", "dev")):
            def login(_: int, dsn: str = dsn[role]) -> None:
                with psycopg.connect(dsn, autocommit=True) as c:
                    c.execute("SELECT 1")
            got[role] = cost(pg.pid, n, login)
        dev, base = got["dev"], got["default"]
        print(f"  round {r + 1}: {DEV_SCRAM_ITERATIONS} iterations client {dev[0]:.2f} server"
              f" {dev[1]:.2f} wall {dev[2]:.2f} | {DEFAULT_ITERATIONS}: client {base[0]:.2f}"
              f" server {base[1]:.2f} wall {base[2]:.2f} | CPU ratio"
              f" {(dev[0] + dev[1]) / (base[0] + base[1]):.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--connections", type=int, default=300)
    args = parser.parse_args()
    base_dir = Path(tempfile.mkdtemp(prefix="safetynet-bench-devstack-"))
    print(f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}")
    pg = PostgresServer(base_dir / "pg")
    try:
        pg.start()
        connections(pg, args.rounds, args.connections)
    finally:
        pg.stop()
        shutil.rmtree(base_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
