"""What does TLS to S3 cost the recording-finalize drain? (issue 16)

A benchmark (not a test). One SeaweedFS serving plain HTTP and TLS side by side (its own
``-s3.cert.file``/``-s3.key.file``, a throwaway ``trustme`` CA given as ``s3.ca_file``:
``tests/secure_s3.py``) and one PostgreSQL. Each round seeds ``--rows`` due finalize
rows of ``bench/recording_finalize.py``'s mixed workload (70% present, 20% missing, 10%
Available-unpublished) and drains them the same way (``run_finalize_cycle`` until a
cycle finds nothing due), once over ``http://`` and once over ``https://`` — the order
alternating between rounds, so a drift of the machine's load hits both. Reported: rows/s
of each and the ratio TLS / plaintext per round and over all rounds (target >= 0.8).

    .venv/bin/python bench/s3_tls.py [--rows 3000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

import attrs
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import recording_finalize as rf

from supervision.app.settings import Config
from supervision.db.migrate import install_demo
from supervision.dev.postgres import PostgresServer
from supervision.logs import configure_logging
from tests.messenger import PREFIX
from tests.secure_s3 import SecureS3, open_secure_s3


def drain_rate(cfg: Config, dsn: str, rows: int, tag: str) -> float:
    rf.seed(dsn, tag, rows, all_available=False)
    seconds, counts, _cycles, _store = trio.run(rf.drain, cfg)
    assert counts.transient == 0 and counts.config_fault == 0, counts
    return rows / seconds


def run(pg: PostgresServer, s3: SecureS3, rows: int, rounds: int) -> None:
    dsn = pg.dsn
    install_demo(dsn)
    s3.server.create_bucket(rf.BUCKET)
    plain = rf.make_config(dsn, s3.server)
    tls = attrs.evolve(plain, s3=attrs.evolve(plain.s3, endpoint_url=s3.https_url,
                                              ca_file=str(s3.ca_file)))
    print(f"rows={rows} rounds={rounds} | s3.concurrency {plain.s3.concurrency} |"
          f" {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}")
    ratios, plain_rates, tls_rates = [], [], []
    for n in range(rounds):
        tag = f"t{n}"
        present = [f"{PREFIX}{rf.rid(tag, i)}" for i in range(rows) if rf.kind(i) == "present"]
        trio.run(rf.upload, s3.server, present)
        order = [("http", plain), ("https", tls)]
        if n % 2:
            order.reverse()
        rates = {name: drain_rate(cfg, dsn, rows, tag) for name, cfg in order}
        plain_rates.append(rates["http"])
        tls_rates.append(rates["https"])
        ratios.append(rates["https"] / rates["http"])
        print(f"  round {n}: http {rates['http']:.0f} rows/s, https {rates['https']:.0f}"
              f" rows/s, ratio {ratios[-1]:.2f}")
    print(f"drain over TLS / plaintext: {statistics.fmean(tls_rates):.0f} /"
          f" {statistics.fmean(plain_rates):.0f} rows/s = ratio"
          f" {statistics.fmean(tls_rates) / statistics.fmean(plain_rates):.2f}"
          f" (rounds {min(ratios):.2f}..{max(ratios):.2f}; target >= 0.8)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=3000, help="rows per drain (default 3000)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (default 3)")
    args = parser.parse_args()
    configure_logging("info", "json", stream=open(os.devnull, "w"))  # noqa: SIM115
    base_dir = Path(tempfile.mkdtemp(prefix="bench-s3-tls-"))
    pg = PostgresServer(base_dir)
    try:
        pg.start()
        with open_secure_s3(base_dir / "s3") as s3:
            run(pg, s3, args.rows, args.rounds)
    finally:
        pg.stop()
        shutil.rmtree(base_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
