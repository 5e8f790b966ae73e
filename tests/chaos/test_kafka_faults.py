"""Kafka chaos: the relay publishes through a fault proxy to a Tansu that advertises the
proxy, so bootstrap and broker connections both cross it. The broker is refused (down) for
many relay cycles, then blackholed (connections accepted, nothing answered) — the broker
itself never restarts, so its topic is a faithful ledger of what was acknowledged. Run in
both of the relay's sources (``table``, ``logical``)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from supervision.dev.s3 import S3Server
from tests.chaos.conftest import ProxiedKafka, Run
from tests.chaos.daemon import Daemon, Daemons, daemon_config, seed, wait_settled
from tests.chaos.sources import SOURCES, waiting

pytestmark = pytest.mark.chaos

# The fault windows (a sleep here IS the fault): ~20 relay polls each
OUTAGE_S = 6.0  # Kafka refused: the proxy down, live connections reset
BLACKHOLE_S = 6.0  # Kafka accepts and never answers


@pytest.mark.parametrize("relay_source", SOURCES, indirect=True)
def test_kafka_down_then_blackholed_loses_nothing(
        run: Run, daemons: Daemons, s3_server: S3Server, bucket: str,
        kafka_via_proxy: ProxiedKafka, tmp_path: Path) -> None:
    kafka = kafka_via_proxy
    run.uploaded = seed(run.dsn, s3_server, bucket, recordings=400, conferences=90, deals=10,
                        available_share=0.3, spread_s=12)
    run.begin_kafka(kafka.bootstrap)
    cfg = daemon_config(run.dsn, s3_url=s3_server.endpoint_url, s3=s3_server, bucket=bucket,
                        kafka=kafka.bootstrap, source=run.source)
    daemon = daemons.add(Daemon(tmp_path, "d1", cfg)).start()
    daemon.wait_for("cycle_completed", job="outbox-relay")  # the relay is publishing
    kafka.proxy.set(down=True)
    time.sleep(OUTAGE_S)
    waiting_when_down = waiting(run.dsn, run.source)
    # straight from refused to blackholed: the backlog of the outage is still waiting when
    # the blackhole starts, so both faults meet rows to publish however fast the relay is
    kafka.proxy.set(down=False, blackhole=True)
    run.fault(f"Kafka refused (proxy down, live connections reset) for {OUTAGE_S:g} s"
              " = ~20 relay polls")
    time.sleep(BLACKHOLE_S)
    waiting_when_blackholed = waiting(run.dsn, run.source)
    kafka.proxy.clear()
    run.fault(f"Kafka blackholed (accepts, never answers) for {BLACKHOLE_S:g} s")
    wait_settled(run.dsn, relay=True, limit_s=90, daemons=daemons,
                 source=run.source)
    failures = sum(1 for e in daemon.events()
                   if e.get("event") in ("kafka_unavailable", "outbox_publish_failed"))
    violations = run.verify(
        title="Kafka down, then blackholed",
        proves="events wait in the outbox while Kafka is unreachable and are all published"
               " afterwards, each event id with one payload, per-key order kept",
        extra_invariants={"outage_not_observed": int(waiting_when_down == 0
                                                     or waiting_when_blackholed == 0)},
        relay_failures_logged=failures, unpublished_during_down=waiting_when_down,
        unpublished_during_blackhole=waiting_when_blackholed)
    assert violations == [], [str(v) for v in violations]
