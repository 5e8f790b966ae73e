"""Process and database chaos: backends terminated mid-transaction, the leader's advisory
lock session killed while the leader is frozen (the standby takes over), `kill -9` mid-drain
then restart, and two or three daemons at once.

Covered elsewhere, not repeated here (tests/integration/test_shutdown.py, real processes):
SIGTERM mid-batch exits 0 within the grace with nothing half done; a second SIGTERM stops
at once and still leaves nothing half done; an actor that crashes on every start escalates
to exit 1 with `daemon_failed` naming it.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from pathlib import Path

import psutil
import pytest

from actors.lock_keeper import lock_key
from supervision.dev.stack import KafkaServer, S3Server
from tests.chaos.conftest import Run
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
from tests.faults import HttpRule, s3_object
from tests.waiting import wait_until

pytestmark = pytest.mark.chaos

DONE = "SELECT count(*) FROM messenger.recording_finalize_attempts WHERE status = 'Done'"
FINALIZE = "recording-finalize"


def lock_holder(dsn: str, job: str) -> int | None:
    """The backend pid holding *job*'s advisory lock on this database, if any."""
    key = lock_key(job) & 0xFFFFFFFFFFFFFFFF
    row = scalar(dsn, "SELECT coalesce(max(pid), 0) FROM pg_locks WHERE locktype = 'advisory'"
                      " AND granted AND database = (SELECT oid FROM pg_database"
                      " WHERE datname = current_database())"
                      " AND classid::bigint = %s AND objid::bigint = %s",
                 key >> 32, key & 0xFFFFFFFF)
    return int(row) or None


def owner(dsn: str, backend: int, daemons: list[Daemon]) -> Daemon | None:
    """Which daemon process owns the client end of *backend*'s connection."""
    port = int(scalar(dsn, "SELECT coalesce(max(client_port), -1) FROM pg_stat_activity"
                           " WHERE pid = %s", backend))
    for daemon in daemons:
        if daemon.alive() and any(c.laddr and c.laddr.port == port for c in
                                  psutil.Process(daemon.pid).net_connections("tcp")):
            return daemon
    return None


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
                        kafka=kafka_server.bootstrap_servers,
                        finalize={"batch_size": 50}, reaper={"batch_size": 20})
    daemon = daemons.add(Daemon(tmp_path, "d1", cfg)).start()
    daemon.wait_for("batch_claimed", job="recording-finalize")
    end = time.monotonic() + 10
    killed = idle_kills = 0
    while time.monotonic() < end:
        n = terminate_backends(run.dsn, busy=True)
        killed += n
        if n == 0:  # nothing in a transaction just now: hit any session (locks, LISTEN)
            idle_kills += terminate_backends(run.dsn)
        time.sleep(0.3)
    run.fault("pg_terminate_backend of daemon sessions inside a transaction", killed)
    run.fault("pg_terminate_backend of idle daemon sessions (lock, LISTEN, pool)", idle_kills)
    wait_settled(run.dsn, relay=True, limit_s=120, daemons=daemons)
    violations = run.verify(
        title="PostgreSQL backends terminated mid-transaction",
        proves="no transition commits without its outbox and realtime rows; the daemon"
               " reconnects and converges without a restart",
        extra_invariants={"daemon_exited": int(not daemon.alive()),
                          "logged_twice": logged_twice(daemons)},
        actor_restarts=daemon.names().count("actor_restarted"))
    assert violations == [], [str(v) for v in violations]


def test_lock_session_killed_standby_takes_over(
        run: Run, daemons: Daemons, s3_server: S3Server, bucket: str, s3_fault: ProxyThread,
        kafka_server: KafkaServer, tmp_path: Path) -> None:
    """The leader is frozen (SIGSTOP) mid-cycle and its advisory-lock session terminated:
    the standby takes the lock within a few seconds and drains; the old leader, resumed
    (SIGCONT), notices the lost lock and nothing is done twice. Three rounds."""
    run.uploaded = seed(run.dsn, s3_server, bucket, recordings=1500, conferences=150,
                        deals=20)
    run.begin_kafka(kafka_server.bootstrap_servers)
    # every object HEAD takes 100 ms more: a drain cycle lasts long enough to be caught
    s3_fault.rules(HttpRule(s3_object("HEAD"), latency=0.1))
    cfg = daemon_config(run.dsn, s3_url=s3_fault.url, s3=s3_server, bucket=bucket,
                        kafka=kafka_server.bootstrap_servers, finalize={"batch_size": 25})
    group = [daemons.add(Daemon(tmp_path, name, cfg)).start() for name in ("a", "b")]
    takeovers: list[float] = []
    failed = 0
    for _ in range(3):
        try:
            wait_until(lambda: lock_holder(run.dsn, FINALIZE) is not None, 10, "a leader")
        except AssertionError:
            break  # the backlog is drained: no cycle holds the lock long enough
        backend = lock_holder(run.dsn, FINALIZE)
        if backend is None:
            continue
        leader = owner(run.dsn, backend, group)
        if leader is None:
            continue
        standby = next(d for d in group if d is not leader)
        os.kill(leader.pid, signal.SIGSTOP)
        try:
            terminate_backends(run.dsn, pids=[backend])
            run.fault("leader SIGSTOPped and its advisory-lock session terminated")
            sent = time.monotonic()
            try:
                def standby_leads(s: Daemon = standby) -> bool:
                    holder = lock_holder(run.dsn, FINALIZE)
                    return holder is not None and owner(run.dsn, holder, [s]) is s
                wait_until(standby_leads, 15, "the standby")
                takeovers.append(round(time.monotonic() - sent, 2))
            except AssertionError:
                failed += 1
            time.sleep(1.0)
        finally:
            os.kill(leader.pid, signal.SIGCONT)
        time.sleep(1.0)
    s3_fault.clear()
    wait_settled(run.dsn, relay=True, limit_s=120, daemons=daemons)
    lost = sum(d.names().count("lock_lost") for d in group)
    violations = run.verify(
        title="Advisory-lock session killed, standby takes over",
        proves="the standby becomes the leader once the lock session is gone; the resumed"
               " old leader detects the loss; every row transitions once",
        extra_invariants={"takeover_failed": failed,
                          "fewer_than_2_takeovers": int(len(takeovers) < 2),
                          "logged_twice": logged_twice(daemons)},
        takeover_seconds=takeovers, lock_lost_logged=lost)
    assert violations == [], [str(v) for v in violations]


def test_kill_9_mid_drain_then_restart_converges(
        run: Run, daemons: Daemons, s3_server: S3Server, bucket: str,
        kafka_server: KafkaServer, tmp_path: Path) -> None:
    """SIGKILL twice while a 2,500-row backlog drains (no shutdown, no lock release: the
    server ends the sessions), restart each time: converges, nothing half done."""
    run.uploaded = seed(run.dsn, s3_server, bucket, recordings=2500, conferences=300,
                        deals=20)
    run.begin_kafka(kafka_server.bootstrap_servers)
    cfg = daemon_config(run.dsn, s3_url=s3_server.endpoint_url, s3=s3_server, bucket=bucket,
                        kafka=kafka_server.bootstrap_servers, finalize={"batch_size": 50})
    daemon = daemons.add(Daemon(tmp_path, "d1", cfg)).start()
    done_at_kill = []
    for threshold in (300, 1200):
        def reached(t: int = threshold) -> bool:
            return int(scalar(run.dsn, DONE)) >= t
        wait_until(reached, 60, f"{threshold} rows done")
        daemon.kill9()
        done_at_kill.append(int(scalar(run.dsn, DONE)))
        run.fault("kill -9 of the daemon mid-drain, then restart")
        daemon.start()
    wait_settled(run.dsn, relay=True, limit_s=120, daemons=daemons)
    violations = run.verify(
        title="kill -9 mid-drain, then restart",
        proves="a crash loses no committed work and half-does nothing; the restarted"
               " daemon finishes the backlog",
        extra_invariants={"kill_not_mid_drain": int(any(n >= 2500 for n in done_at_kill))},
        done_at_each_kill=done_at_kill)
    assert violations == [], [str(v) for v in violations]


@pytest.mark.parametrize("count", [2, 3])
def test_several_daemons_at_once(
        count: int, run: Run, daemons: Daemons, s3_server: S3Server, bucket: str,
        kafka_server: KafkaServer, tmp_path: Path) -> None:
    """Two or three daemons on one database: each row finalised / reaped once."""
    run.uploaded = seed(run.dsn, s3_server, bucket, recordings=1500, conferences=300,
                        deals=20, spread_s=6)
    run.begin_kafka(kafka_server.bootstrap_servers)
    cfg = daemon_config(run.dsn, s3_url=s3_server.endpoint_url, s3=s3_server, bucket=bucket,
                        kafka=kafka_server.bootstrap_servers, finalize={"batch_size": 50},
                        reaper={"batch_size": 20})
    group = [daemons.add(Daemon(tmp_path, f"d{i}", cfg)) for i in range(count)]
    for daemon in group:
        daemon.start()
    run.fault(f"{count} daemons racing for the same rows", count)
    wait_settled(run.dsn, relay=True, limit_s=120, daemons=daemons)
    leaders = {d.name: sum(1 for e in d.events() if e.get("event") == "cycle_completed")
               for d in group}
    violations = run.verify(
        title=f"{count} daemons at once",
        proves="single-runner per job (advisory lock) plus guarded transitions: every"
               " recording and conference transitions exactly once",
        extra_invariants={"logged_twice": logged_twice(daemons)},
        cycles_completed_per_daemon=leaders)
    assert violations == [], [str(v) for v in violations]
