"""Process and database chaos: backends terminated mid-transaction, a frozen leader fenced
and replaced by a standby (2 and 3 daemons, no session killed by hand), `kill -9` mid-drain
then restart, and two or three daemons at once — each run in both of the relay's sources
(``table``, ``logical``: the relay is part of every scenario here).

Covered elsewhere, not repeated here (tests/integration/app/test_shutdown.py, real processes):
SIGTERM mid-batch exits 0 within the grace with nothing half done; a second SIGTERM stops
at once and still leaves nothing half done; an actor that crashes on every start escalates
to exit 1 with `daemon_failed` naming it.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections import Counter
from pathlib import Path
from statistics import median
from typing import Any

import httpx
import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from supervision.app.queries import ALL_QUERIES
from supervision.dev.kafka import KafkaServer
from supervision.dev.s3 import S3Server
from tests.chaos.conftest import ProxiedKafka, Run
from tests.chaos.daemon import (
    Daemon,
    Daemons,
    ProxyThread,
    daemon_config,
    scalar,
    seed,
    terminate_backends,
    wait_settled,
)
from tests.chaos.sources import SOURCES, backlog, moved
from tests.faults import HttpRule, s3_object
from tests.waiting import wait_until

pytestmark = pytest.mark.chaos

DONE = "SELECT count(*) FROM messenger.recording_finalize_attempts WHERE status = 'Done'"
FINALIZE = "recording-finalize"
# The fault windows (a sleep here IS the fault being injected):
KILL_WINDOW_S = 10.0  # backends terminated ...
KILL_EVERY_S = 0.3  # ... every 300 ms
FROZEN_AFTER_TAKEOVER_S = 1.0  # the replaced leader stays frozen while the standby works


def logged_twice(daemons: Daemons) -> int:
    """Terminal outcomes logged more than once across every daemon's log."""
    seen: Counter[str] = Counter()
    for daemon in daemons.all:
        for e in daemon.events():
            if e.get("event") in ("recording_reconciled", "recording_failed"):
                seen[str(e.get("recording_id"))] += 1
            elif e.get("event") == "conference_reaped":
                seen[str(e.get("conference_id"))] += 1
    return sum(1 for n in seen.values() if n > 1)


@pytest.mark.parametrize("relay_source", SOURCES, indirect=True)
def test_backends_terminated_mid_transaction(
        run: Run, daemons: Daemons, s3_server: S3Server, bucket: str,
        kafka_server: KafkaServer, tmp_path: Path) -> None:
    """`pg_terminate_backend` of every daemon session inside a transaction, every 300 ms
    for 10 s: a transaction either commits whole or not at all, so no state change without
    its outbox/realtime rows (checker), and the daemon recovers by itself."""
    run.uploaded = seed(run.dsn, s3_server, bucket, recordings=2000, conferences=300,
                        deals=20, spread_s=8)
    run.begin_kafka(kafka_server.bootstrap_servers)
    cfg = daemon_config(run.dsn, s3_url=s3_server.endpoint_url, s3=s3_server, bucket=bucket,
                        kafka=kafka_server.bootstrap_servers, source=run.source,
                        finalize={"batch_size": 50}, reaper={"batch_size": 20})
    daemon = daemons.add(Daemon(tmp_path, "d1", cfg)).start()
    daemon.wait_for("batch_claimed", job="recording-finalize")
    end = time.monotonic() + KILL_WINDOW_S
    killed = idle_kills = 0
    while time.monotonic() < end:
        n = terminate_backends(run.dsn, busy=True)
        killed += n
        if n == 0:  # nothing in a transaction just now: hit any session (locks, LISTEN)
            idle_kills += terminate_backends(run.dsn)
        time.sleep(KILL_EVERY_S)
    run.fault("pg_terminate_backend of daemon sessions inside a transaction", killed)
    run.fault("pg_terminate_backend of idle daemon sessions (lock, LISTEN, pool)", idle_kills)
    wait_settled(run.dsn, relay=True, limit_s=120, daemons=daemons,
                 source=run.source)
    violations = run.verify(
        title="PostgreSQL backends terminated mid-transaction",
        proves="no transition commits without its outbox and realtime rows; the daemon"
               " reconnects and converges without a restart",
        extra_invariants={"daemon_exited": int(not daemon.alive()),
                          "logged_twice": logged_twice(daemons)},
        actor_restarts=daemon.names().count("actor_restarted"))
    assert violations == [], [str(v) for v in violations]


def live_lease(dsn: str, job: str) -> tuple[int, int] | None:
    """(holder's process id, term) of *job*'s live lease, if any."""
    row = scalar(dsn, "SELECT coalesce(max(split_part(holder, ':', 2) || ':' || term), '')"
                      " FROM safetynet.leases WHERE job = %s"
                      " AND expires_at > clock_timestamp()", job)
    if not row:
        return None
    pid, term = str(row).split(":")
    return int(pid), int(term)


def fenced_writes(daemon: Daemon) -> int:
    """``safetynet_fenced_writes_rejected_total`` summed over jobs, from its /metrics."""
    text = httpx.get(f"http://127.0.0.1:{daemon.port}/metrics", timeout=5).text
    return int(sum(sample.value for family in text_string_to_metric_families(text)
                   for sample in family.samples
                   if sample.name == "safetynet_fenced_writes_rejected_total"))


LEASE_TTL_S, POLL_S = 3.0, 0.5


@pytest.mark.parametrize("count", [2, 3])
@pytest.mark.parametrize("relay_source", SOURCES, indirect=True)
def test_frozen_leader_is_fenced_and_replaced_without_an_operator(
        count: int, run: Run, daemons: Daemons, s3_server: S3Server, bucket: str,
        s3_fault: ProxyThread, kafka_server: KafkaServer, tmp_path: Path) -> None:
    """The leader is SIGSTOPped mid-cycle (its sessions stay open: the kernel answers for
    it) and no session is killed by hand: a standby holds the lease within lock_ttl + one
    polling interval; SIGCONT, and the old leader's late writes are rejected by the fence
    (`lease_lost`, counted), it steps down, and nothing is done twice. Five rounds."""
    run.uploaded = seed(run.dsn, s3_server, bucket, recordings=2000, conferences=150,
                        deals=20)
    run.begin_kafka(kafka_server.bootstrap_servers)
    # every object HEAD takes 150 ms more: the drain outlasts five rounds
    s3_fault.rules(HttpRule(s3_object("HEAD"), latency=0.15))
    ttl = f"{LEASE_TTL_S:g}s"
    cfg = daemon_config(
        run.dsn, s3_url=s3_fault.url, s3=s3_server, bucket=bucket,
        kafka=kafka_server.bootstrap_servers, source=run.source,
        finalize={"batch_size": 25, "polling_interval": f"{POLL_S:g}s", "lock_ttl": ttl,
                  "max_run_duration": "2s"},
        reaper={"polling_interval": f"{POLL_S:g}s", "lock_ttl": ttl,
                "max_run_duration": "2s"},
        outbox_relay={"lock_ttl": ttl},
        postgres={"statement_timeout": "2s", "lock_timeout": "1s",
                  "idle_in_transaction_session_timeout": "2s"})
    group = [daemons.add(Daemon(tmp_path, f"d{i}", cfg)).start() for i in range(count)]
    by_pid = {d.pid: d for d in group}
    takeovers: list[float] = []
    failed = stale_leader = 0
    for _ in range(5):
        wait_until(lambda: live_lease(run.dsn, FINALIZE) is not None, 20, "a leader")
        lease = live_lease(run.dsn, FINALIZE)
        if lease is None or lease[0] not in by_pid:
            continue
        leader_pid, term = lease
        os.kill(leader_pid, signal.SIGSTOP)
        run.fault("leader SIGSTOPped mid-cycle (no session killed)")
        sent = time.monotonic()
        try:
            def replaced(leader_pid: int = leader_pid, term: int = term) -> bool:
                now = live_lease(run.dsn, FINALIZE)
                return now is not None and now[0] != leader_pid and now[1] > term
            wait_until(replaced, 4 * (LEASE_TTL_S + POLL_S), "a standby to take the lease",
                       step_s=0.02)  # a measured takeover time
            takeovers.append(round(time.monotonic() - sent, 2))
        except AssertionError:
            failed += 1
        finally:
            time.sleep(FROZEN_AFTER_TAKEOVER_S)  # the old leader's writes wait meanwhile
            os.kill(leader_pid, signal.SIGCONT)
        # resumed, it answers again and does not lead under its old term (a cycle that
        # had nothing left to write simply ends: only writes in flight meet the fence)
        wait_until(by_pid[leader_pid].answers, 15, "the resumed leader")
        now = live_lease(run.dsn, FINALIZE)
        stale_leader += int(now is not None and now == (leader_pid, term))
    s3_fault.clear()
    wait_settled(run.dsn, relay=True, limit_s=120, daemons=daemons,
                 source=run.source)
    fenced = sum(fenced_writes(d) for d in group)
    lease_lost = sum(d.names().count("lease_lost") for d in group)
    bound = LEASE_TTL_S + POLL_S
    violations = run.verify(
        title=f"Frozen leader fenced and replaced ({count} daemons)",
        proves="a SIGSTOPped leader is replaced within lock_ttl + one polling interval with"
               " no session killed by hand; resumed, its late writes are rejected by the"
               " lease fence and it steps down; every row transitions once",
        extra_invariants={"takeover_failed": failed,
                          "fewer_than_4_takeovers": int(len(takeovers) < 4),
                          "stale_leader_after_resume": stale_leader,
                          "fence_never_met": int(fenced + lease_lost == 0),
                          "logged_twice": logged_twice(daemons),
                          "daemon_exited": sum(1 for d in group if not d.alive())},
        takeover_seconds=takeovers,
        takeover_min_median_max=[min(takeovers, default=0), median(takeovers or [0]),
                                 max(takeovers, default=0)],
        takeover_bound_s=bound, fenced_writes_rejected=fenced, lease_lost_logged=lease_lost)
    assert violations == [], [str(v) for v in violations]


@pytest.mark.parametrize("relay_source", SOURCES, indirect=True)
def test_kill_9_mid_drain_then_restart_converges(
        run: Run, daemons: Daemons, s3_server: S3Server, bucket: str,
        kafka_server: KafkaServer, tmp_path: Path) -> None:
    """SIGKILL twice while a 2,500-row backlog drains (no shutdown, no lock release: the
    server ends the sessions), restart each time: converges, nothing half done."""
    run.uploaded = seed(run.dsn, s3_server, bucket, recordings=2500, conferences=300,
                        deals=20)
    run.begin_kafka(kafka_server.bootstrap_servers)
    cfg = daemon_config(run.dsn, s3_url=s3_server.endpoint_url, s3=s3_server, bucket=bucket,
                        kafka=kafka_server.bootstrap_servers, source=run.source,
                        finalize={"batch_size": 50})
    daemon = daemons.add(Daemon(tmp_path, "d1", cfg)).start()
    done_at_kill = []
    for threshold in (300, 1200):
        def reached(t: int = threshold) -> bool:
            return int(scalar(run.dsn, DONE)) >= t
        wait_until(reached, 60, f"{threshold} rows done")
        daemon.kill9()
        done_at_kill.append(int(scalar(run.dsn, DONE)))
        run.crashed()
        run.fault("kill -9 of the daemon mid-drain, then restart")
        daemon.start()
    wait_settled(run.dsn, relay=True, limit_s=120, daemons=daemons,
                 source=run.source)
    violations = run.verify(
        title="kill -9 mid-drain, then restart",
        proves="a crash loses no committed work and half-does nothing; the restarted"
               " daemon finishes the backlog",
        extra_invariants={"kill_not_mid_drain": int(any(n >= 2500 for n in done_at_kill))},
        done_at_each_kill=done_at_kill)
    assert violations == [], [str(v) for v in violations]


RELAY_BACKLOG = 3000  # Available recordings whose events wait in the outbox
RELAY_KILLS = 4
DRAIN_BATCH = 10  # the relay's batch_size here: small waves, so the drain lasts ...
DRAIN_LATENCY_S = 0.1  # ... with every broker answer 100 ms late (the fault proxy)


@pytest.mark.parametrize("relay_source", SOURCES, indirect=True)
def test_kill_9_while_the_relay_drains_loses_nothing(
        run: Run, daemons: Daemons, s3_server: S3Server, bucket: str,
        kafka_via_proxy: ProxiedKafka, tmp_path: Path) -> None:
    """A backlog of 3,200 events (3,000 recordings, 200 conferences on 10 deal keys)
    written with the relay off; then the relay drains it in small waves (batch 10, each
    broker answer 100 ms late) and the daemon is SIGKILLed four times, each at a random
    moment (seeded) once the relay recorded progress since its restart, and restarted.
    Every event reaches Kafka, per key in order; what goes again is only what Kafka had
    and the relay had not recorded at a crash (each window measured)."""
    kafka = kafka_via_proxy
    with psycopg.connect(run.dsn, autocommit=True) as conn:
        conn.execute(ALL_QUERIES["dev_seed_recordings"],
                     {"n": RELAY_BACKLOG, "available": RELAY_BACKLOG})
    run.uploaded = seed(run.dsn, s3_server, bucket, recordings=0, conferences=300, deals=10)

    def config(**more: Any) -> dict[str, Any]:
        return daemon_config(run.dsn, s3_url=s3_server.endpoint_url, s3=s3_server,
                             bucket=bucket, kafka=kafka.bootstrap, source=run.source, **more)

    writer = daemons.add(Daemon(tmp_path, "writer", config(relay=False))).start()
    wait_settled(run.dsn, relay=False, limit_s=120, daemons=daemons)
    writer.terminate()
    run.begin_kafka(kafka.bootstrap)
    run.relay_batch = DRAIN_BATCH
    kafka.proxy.set(latency=DRAIN_LATENCY_S)
    relay = config(outbox_relay={"batch_size": DRAIN_BATCH})
    daemon = daemons.add(Daemon(tmp_path, "relay", relay)).start()
    rng = random.Random(37)
    left_at_kill = []
    for _ in range(RELAY_KILLS):
        before = moved(run.dsn, run.source)
        wait_until(lambda b=before: moved(run.dsn, run.source) != b, 60,
                   "the relay to record progress")
        time.sleep(rng.uniform(0, 0.5))  # the fault: a random point of the drain
        daemon.kill9()
        left_at_kill.append(backlog(run.dsn, run.source))
        run.crashed()
        run.fault("kill -9 of the daemon while the relay drains, then restart")
        daemon.start()
    kafka.proxy.clear()
    wait_settled(run.dsn, relay=True, limit_s=120, daemons=daemons, source=run.source)
    violations = run.verify(
        title="kill -9 while the relay drains, then restart",
        proves="a crash at any point of the relay's drain loses no event and breaks no"
               " key's order; what it sends again is bounded by the unacknowledged window",
        extra_invariants={"kill_after_drain": int(any(n == 0 for n in left_at_kill))},
        undelivered_at_each_kill=left_at_kill)
    assert violations == [], [str(v) for v in violations]


@pytest.mark.parametrize("count", [2, 3])
@pytest.mark.parametrize("relay_source", SOURCES, indirect=True)
def test_several_daemons_at_once(
        count: int, run: Run, daemons: Daemons, s3_server: S3Server, bucket: str,
        kafka_server: KafkaServer, tmp_path: Path) -> None:
    """Two or three daemons on one database: each row finalised / reaped once."""
    run.uploaded = seed(run.dsn, s3_server, bucket, recordings=1500, conferences=300,
                        deals=20, spread_s=6)
    run.begin_kafka(kafka_server.bootstrap_servers)
    cfg = daemon_config(run.dsn, s3_url=s3_server.endpoint_url, s3=s3_server, bucket=bucket,
                        kafka=kafka_server.bootstrap_servers, source=run.source,
                        finalize={"batch_size": 50}, reaper={"batch_size": 20})
    group = [daemons.add(Daemon(tmp_path, f"d{i}", cfg)) for i in range(count)]
    for daemon in group:
        daemon.start()
    run.fault(f"{count} daemons racing for the same rows", count)
    wait_settled(run.dsn, relay=True, limit_s=120, daemons=daemons,
                 source=run.source)
    leaders = {d.name: sum(1 for e in d.events() if e.get("event") == "cycle_completed")
               for d in group}
    violations = run.verify(
        title=f"{count} daemons at once",
        proves="single-runner per job (advisory lock) plus guarded transitions: every"
               " recording and conference transitions exactly once",
        extra_invariants={"logged_twice": logged_twice(daemons)},
        cycles_completed_per_daemon=leaders)
    assert violations == [], [str(v) for v in violations]
