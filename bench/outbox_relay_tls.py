"""How fast does the outbox relay publish over TLS, against plaintext in the same run? (issue 16)

A benchmark (not a test). Two Tansu brokers run side by side: one plaintext, one behind
Debian's ``stunnel`` with a throwaway ``trustme`` CA (``tests/tls_terminator.py``: Tansu
advertises the terminator's port, so every connection the relay makes is TLS). Each
round writes ``--rows`` outbox rows (the workload of ``bench/outbox_relay.py``: ~600-byte
JSON payloads, ``--keys`` keys, the committer's headers) and drains them with
``run_once(cfg, Job.OUTBOX_RELAY)`` end to end — once to the plaintext broker
(``security_protocol = "PLAINTEXT"``) and once to the TLS one (``"SSL"``, ``ssl_cafile`` =
the throwaway CA), in alternating order from round to round so that drift on a shared
machine hits both. The figure is TLS events/s as a ratio to plaintext events/s of the
same round (target >= 0.8).

TLS here costs the relay's handshake and record encryption on the client side plus
stunnel's decryption and an extra loopback hop on the broker side, all on the same
cores: an upper bound of what TLS costs against a broker that terminates TLS itself.

Run (needs stunnel and the dev extra's trustme):

    .venv/bin/python bench/outbox_relay_tls.py [--rows 20000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from actors.kafka.security import client_security
from bench._measure import spread
from bench._relay_workload import Workload
from supervision.app.daemon import run_once
from supervision.app.settings import Config, config_from_dict
from supervision.db.migrate import install_demo
from supervision.dev.kafka import KafkaServer
from supervision.dev.postgres import PostgresServer
from supervision.dev.processes import start_all, stop_all
from supervision.jobs import Job
from supervision.logs import configure_logging
from tests.tls_terminator import make_pki, open_tls_kafka


def make_config(dsn: str, kafka: dict[str, str]) -> Config:
    return config_from_dict({
        "postgres": {"dsn": dsn},
        "kafka": {"client_id": "bench-relay", **kafka},
        "outbox_relay": {"batch_size": 500, "poll_interval": "1s"},
    })


def create_topic(cfg: Config, name: str, partitions: int) -> None:
    """CreateTopics with the relay's own security settings (the TLS broker's metadata
    sends every client to the terminator)."""
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    async def create() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=cfg.kafka.bootstrap_servers,
                                    **client_security(cfg.kafka))
        await admin.start()
        try:
            await admin.create_topics([NewTopic(name, partitions, 1)])
        finally:
            await admin.close()

    asyncio.run(create())


def drain(cfg: Config, work: Workload, topic: str, partitions: int) -> float:
    """Events/s of one run-once drain of the workload to *topic*."""
    create_topic(cfg, topic, partitions)
    work.insert(cfg.postgres.dsn.reveal(), topic, str(uuid.uuid4()))
    started = time.perf_counter()
    counts = trio.run(run_once, cfg, Job.OUTBOX_RELAY)
    wall = time.perf_counter() - started
    assert counts["published"] == len(work.rows) and counts["failed"] == 0, counts
    return len(work.rows) / wall


def run(pg: PostgresServer, plain: KafkaServer, base_dir: Path,
        args: argparse.Namespace) -> None:
    install_demo(pg.dsn)
    pki = make_pki(base_dir / "pki")
    with open_tls_kafka(base_dir / "tls", pki) as tls:
        configs = {
            "plaintext": make_config(pg.dsn, {"bootstrap_servers": plain.bootstrap_servers}),
            "tls": make_config(pg.dsn, {"bootstrap_servers": tls.bootstrap_servers,
                                        "security_protocol": "SSL",
                                        "ssl_cafile": str(pki.ca)}),
        }
        work = Workload(args.rows, args.keys)
        tag = uuid.uuid4().hex[:8]
        print(f"rows={args.rows} keys={args.keys} value {work.value_bytes():.0f} B,"
              f" {args.partitions} partitions, rounds={args.rounds}, {os.cpu_count()} CPUs,"
              f" load {os.getloadavg()[0]:.2f}")
        rounds: list[dict[str, float]] = []
        for n in range(args.rounds):
            order = ("plaintext", "tls") if n % 2 == 0 else ("tls", "plaintext")
            rates: dict[str, Any] = {}
            for kind in order:
                topic = f"bench.relay-tls.{tag}.{kind}{n}"
                rates[kind] = drain(configs[kind], work, topic, args.partitions)
            rates["ratio"] = rates["tls"] / rates["plaintext"]
            rounds.append(rates)
            print(f"round {n + 1}: plaintext {rates['plaintext']:.0f} events/s, TLS"
                  f" {rates['tls']:.0f} events/s, ratio {rates['ratio']:.2f}"
                  f" (load {os.getloadavg()[0]:.2f})")
    ratios = [r["ratio"] for r in rounds]
    ok = {True: "ok", False: "MISSED"}
    print(f"\nplaintext events/s {spread([r['plaintext'] for r in rounds])}")
    print(f"TLS events/s {spread([r['tls'] for r in rounds])}")
    print(f"ratio (TLS/plaintext) {spread(ratios, '{:.2f}')}"
          f"  target >= 0.8: {ok[statistics.median(ratios) >= 0.8]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000, help="outbox rows (default 20000)")
    parser.add_argument("--keys", type=int, default=1000, help="message keys (default 1000)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (default 3)")
    parser.add_argument("--partitions", type=int, default=3, help="per topic (default 3)")
    args = parser.parse_args()
    configure_logging("info", "json", stream=open(os.devnull, "w"))  # noqa: SIM115
    base_dir = Path(tempfile.mkdtemp(prefix="bench-relay-tls-"))
    servers = [PostgresServer(base_dir), KafkaServer(base_dir)]
    try:
        start_all(servers)
        run(servers[0], servers[1], base_dir, args)  # type: ignore[arg-type]
    finally:
        stop_all(servers)
        shutil.rmtree(base_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
