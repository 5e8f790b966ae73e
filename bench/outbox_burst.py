"""A burst into an idle outbox, before autoanalyze: how fast does the relay drain it with
the claim's plan pinned to the index, and with the planner left to the statistics?
(issue 37 item 6)

A benchmark (not a test). Each round, for each variant in turn (alternating, one run):
the outbox is emptied and analyzed empty (an idle outbox's statistics: "no rows"),
autovacuum is switched off on it (so autoanalyze cannot rescue a variant mid-drain), the
activity counters are reset, ``--rows`` rows (bench/_relay_workload.py's workload, COPY) are
committed at once, and ``run_once(cfg, Job.OUTBOX_RELAY)`` drains them end to end:

  pinned     the claim as shipped: ``outbox_claim_plan`` (``SET LOCAL enable_sort = off``)
             first in each claim's transaction;
  unpinned   the same relay with ``outbox_claim_plan`` replaced by ``SELECT 1`` (the claim
             before issue 37 item 6): the planner trusts the empty table's statistics;
  analyzed   unpinned after an ``ANALYZE`` of the burst (what autoanalyze gives, later).

Every row must be published once. Run:

    .venv/bin/python bench/outbox_burst.py [--rows 100000] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import uuid
from pathlib import Path

import psycopg
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from actors.envelope import event_headers
from actors.outbox.queries import OUTBOX_QUERIES
from bench._relay_workload import (
    COPY,
    EVENT_TYPE,
    SOURCE,
    Workload,
    alternate_drains,
    make_config,
    published,
)
from supervision.app.daemon import run_once
from supervision.dev.kafka import KafkaServer
from supervision.dev.postgres import PostgresServer
from supervision.jobs import Job

VARIANTS = ("pinned", "unpinned", "analyzed")
PINNED = OUTBOX_QUERIES["outbox_claim_plan"]


def burst(dsn: str, work: Workload, topic: str, analyzed: bool) -> None:
    """An idle outbox analyzed empty, then every row of *work* committed at once."""
    run_id = str(uuid.uuid4())
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE messenger.integration_outbox, safetynet.outbox_dead_letters")
        conn.execute("ALTER TABLE messenger.integration_outbox"
                     " SET (autovacuum_enabled = off)")
        conn.execute("ANALYZE messenger.integration_outbox")
        conn.execute("SELECT pg_stat_reset()")
        with conn.cursor() as cur, cur.copy(COPY) as copy:
            for key, dedupe, payload in work.rows:
                copy.write_row((topic, key, dedupe, EVENT_TYPE, json.dumps(payload),
                                event_headers(topic, dedupe, EVENT_TYPE, run_id, SOURCE)))
        if analyzed:
            conn.execute("ANALYZE messenger.integration_outbox")


def drain(pg: PostgresServer, kafka: KafkaServer, work: Workload, variant: str,
          topic: str) -> float:
    """Seconds for run-once to publish the burst."""
    cfg = make_config(pg.dsn, kafka)
    kafka.create_topic(topic, 3)
    burst(pg.dsn, work, topic, analyzed=variant == "analyzed")
    OUTBOX_QUERIES["outbox_claim_plan"] = PINNED if variant == "pinned" else "SELECT 1"
    try:
        started = time.perf_counter()
        counts = trio.run(run_once, cfg, Job.OUTBOX_RELAY)
        seconds = time.perf_counter() - started
    finally:
        OUTBOX_QUERIES["outbox_claim_plan"] = PINNED
    assert counts["published"] == len(work.rows) and counts["failed"] == 0, counts
    assert published(pg.dsn, topic) == len(work.rows)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000, help="burst rows (100000)")
    parser.add_argument("--keys", type=int, default=1000, help="message keys (1000)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds (default 2)")
    args = parser.parse_args()
    rates = alternate_drains("burst", args.rows, args.keys, args.rounds, VARIANTS,
                             name=str, label=lambda variant: f"{variant:9}", drain=drain)
    for variant in VARIANTS:
        print(f"{variant:9} events/s median {statistics.median(rates[variant]):.0f}"
              f" ({', '.join(f'{r:.0f}' for r in rates[variant])})")


if __name__ == "__main__":
    main()
