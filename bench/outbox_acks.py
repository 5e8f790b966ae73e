"""What ``[kafka] acks = "all"`` (the default) costs the relay against ``acks = "1"``
(issue 37 item 6), alternating in one run.

A benchmark (not a test). Each round, for each setting in turn, ``--rows`` outbox rows
(bench/_relay_workload.py's workload: COPY, then VACUUM ANALYZE) to a fresh topic, drained
end to end by ``run_once(cfg, Job.OUTBOX_RELAY)`` as ``safetynet run-once`` does. Every
row must be published. On the dev broker (Tansu, one broker, no replicas) both settings
wait for the same single copy: the figure is the client's and the protocol's share, not
a replicated cluster's (where ``all`` also waits for the slowest in-sync follower).
Run:

    .venv/bin/python bench/outbox_acks.py [--rows 20000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from pathlib import Path

import attrs
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._relay_workload import Workload, alternate_drains, make_config, published
from supervision.app.daemon import run_once
from supervision.config import Acks
from supervision.dev.kafka import KafkaServer
from supervision.dev.postgres import PostgresServer
from supervision.jobs import Job


def drain(pg: PostgresServer, kafka: KafkaServer, work: Workload, acks: Acks,
          topic: str) -> float:
    """Seconds for run-once to publish *work* with *acks*."""
    cfg = make_config(pg.dsn, kafka)
    cfg = attrs.evolve(cfg, kafka=attrs.evolve(cfg.kafka, acks=acks))
    kafka.create_topic(topic, 3)
    work.insert(pg.dsn, topic, str(uuid.uuid4()))
    started = time.perf_counter()
    counts = trio.run(run_once, cfg, Job.OUTBOX_RELAY)
    seconds = time.perf_counter() - started
    assert counts["published"] == len(work.rows) and counts["failed"] == 0, counts
    assert published(pg.dsn, topic) == len(work.rows)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000, help="rows per drain (20000)")
    parser.add_argument("--keys", type=int, default=1000, help="message keys (1000)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (default 3)")
    args = parser.parse_args()
    rates = alternate_drains("acks", args.rows, args.keys, args.rounds, list(Acks),
                             name=lambda acks: acks.name,
                             label=lambda acks: f"acks={acks.value:3}", drain=drain)
    ratios = [a / b for a, b in zip(rates[Acks.ALL], rates[Acks.LEADER], strict=True)]
    for acks in Acks:
        print(f"acks={acks.value:3} events/s median {statistics.median(rates[acks]):.0f}")
    print(f"all / 1 per round: {', '.join(f'{r:.2f}' for r in ratios)}")


if __name__ == "__main__":
    main()
