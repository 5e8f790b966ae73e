"""Two `safetynet run` processes against one database: the database-wide scans (gauge
refresher, auditor) run on one of them only, and the other takes over when it stops."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import psycopg
import structlog
import tomli_w
import trio

from actors.leases.lease import LockConnection
from actors.leases.lock_keeper import LockedJob
from actors.leases.scan_leader import no_cycle, serve_scan_leader
from supervision.dev.s3 import S3Server
from supervision.jobs import SCAN_LEASE
from supervision.metrics import LEADER_GAUGES
from tests.integration.app.test_reload import free_port
from tests.integration.app.test_shutdown import events
from tests.integration.reaper.test_conference_reaper import wait_for
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[3]
LEADER_ONLY_GAUGE = "safetynet_pg_notification_queue_usage"


class Replica:
    """One daemon process with its own log and /metrics port."""

    def __init__(self, name: str, tmp_path: Path, raw: dict[str, Any]) -> None:
        self.port = free_port()
        self.config = tmp_path / f"{name}.toml"
        self.config.write_text(tomli_w.dumps(
            {**raw, "http": {"listen": f"127.0.0.1:{self.port}"}}))
        self.log = tmp_path / f"{name}.log"
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "supervision.app", "run", "-c", str(self.config)],
                cwd=ROOT, env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
                stdout=out, stderr=subprocess.STDOUT)

    def count(self, event: str) -> int:
        return sum(1 for e in events(self.log) if e.get("event") == event)

    def metrics(self) -> str:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics",
                                        timeout=2) as resp:
                return str(resp.read().decode())
        except OSError:
            return ""

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=30)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()


def scan_lease_holder(dsn: str) -> str | None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT holder FROM safetynet.leases WHERE job = 'database-scans'"
                           " AND expires_at > clock_timestamp()").fetchone()
    return None if row is None else str(row[0])


def test_only_one_replica_scans_and_the_other_takes_over_when_it_stops(
        db_dsn: str, s3_server: S3Server, bucket: str, tmp_path: Path) -> None:
    """With two replicas, the gauge refresher and the auditor run (and the database-wide
    gauges are exported) on the lease holder only; after it stops, the standby leads."""
    creds = s3_server.credentials
    raw = {
        "postgres": {"dsn": db_dsn},
        "s3": {"endpoint_url": s3_server.endpoint_url, "bucket": bucket,
               "region": creds.region, "access_key_id": creds.access_key_id,
               "secret_access_key": creds.secret_access_key},
        "jobs": {"conference_reaper": {"enabled": False}},
        "outbox_relay": {"enabled": False},
        "audit": {"interval": "1s"},
        "supervision": {"shutdown_grace": "5s"},
        "logging": {"format": "json", "level": "debug"},
    }
    first = Replica("a", tmp_path, raw)
    second: Replica | None = None
    try:
        wait_until(lambda: first.count("gauges_refreshed") >= 1, 30, "a's first refresh")
        assert first.count("scan_leader_elected") == 1
        second = Replica("b", tmp_path, raw)
        b = second
        wait_until(lambda: "safetynet_lock_held" in b.metrics(), 30, "b's /metrics")
        start_a, start_audit = first.count("gauges_refreshed"), first.count("audit_ran")
        # three more refresh rounds (every 5 s) of the leader while b stands by
        wait_until(lambda: first.count("gauges_refreshed") >= start_a + 3, 30,
                   "three refresh rounds of a")
        assert first.count("audit_ran") > start_audit
        assert second.count("gauges_refreshed") == 0
        assert second.count("audit_ran") == 0
        assert second.count("scan_leader_elected") == 0
        assert 'safetynet_lock_held{job="database-scans"} 0.0' in second.metrics()
        assert LEADER_ONLY_GAUGE not in second.metrics()
        assert "messenger_recording_finalize_backlog" not in second.metrics()
        assert LEADER_ONLY_GAUGE in first.metrics()
        assert 'safetynet_lock_held{job="database-scans"} 1.0' in first.metrics()
        holder = scan_lease_holder(db_dsn)
        assert holder is not None and f":{first.proc.pid}:" in holder

        assert first.stop() == 0
        wait_until(lambda: b.count("scan_leader_elected") == 1, 15, "b to take the lease")
        wait_until(lambda: b.count("gauges_refreshed") >= 1 and b.count("audit_ran") >= 1,
                   15, "b's first scans")
        assert LEADER_ONLY_GAUGE in second.metrics()
        holder = scan_lease_holder(db_dsn)
        assert holder is not None and f":{second.proc.pid}:" in holder
        took_over = next(e for e in events(second.log) if e["event"] == "scan_leader_elected")
        assert took_over["how"] == "released"  # a graceful stop gives the lease back
    finally:
        first.kill()
        if second is not None:
            second.kill()


def test_a_killed_scan_leader_is_replaced_at_once(
        db_dsn: str, s3_server: S3Server, bucket: str, tmp_path: Path) -> None:
    """SIGKILL of the leader ends its lock session: the standby takes the lease at its
    next try (no TTL to wait out) and scans."""
    creds = s3_server.credentials
    raw = {
        "postgres": {"dsn": db_dsn},
        "s3": {"endpoint_url": s3_server.endpoint_url, "bucket": bucket,
               "region": creds.region, "access_key_id": creds.access_key_id,
               "secret_access_key": creds.secret_access_key},
        "jobs": {"conference_reaper": {"enabled": False}},
        "outbox_relay": {"enabled": False},
        "logging": {"format": "json", "level": "debug"},
    }
    first = Replica("a", tmp_path, raw)
    second: Replica | None = None
    try:
        wait_until(lambda: first.count("gauges_refreshed") >= 1, 30, "a's first refresh")
        second = Replica("b", tmp_path, raw)
        b = second
        wait_until(lambda: "safetynet_lock_held" in b.metrics(), 30, "b's /metrics")
        assert second.count("scan_leader_elected") == 0
        first.kill()
        wait_until(lambda: b.count("scan_leader_elected") == 1, 15, "b to take the lease")
        took_over = next(e for e in events(second.log) if e["event"] == "scan_leader_elected")
        assert took_over["how"] == "session_gone"
        wait_until(lambda: b.count("gauges_refreshed") >= 1, 15, "b's first refresh")
    finally:
        first.kill()
        if second is not None:
            second.kill()


def fast_lease(ttl: float = 30.0) -> LockedJob[Any]:
    return LockedJob(SCAN_LEASE, interval=0.1, lock_ttl=ttl, cycle=no_cycle,
                     ping_interval=0.05, ping_timeout=0.5, reconnect_base=0.05,
                     reconnect_cap=0.1)


async def test_leader_whose_lease_was_taken_over_stops_its_scans_and_stands_by(
        db_dsn: str) -> None:
    """A leader frozen past its TTL (the lease expired and another holder took it) sees
    its renewal refused: its scans are cancelled, it exports no database-wide gauge, and
    it leads again once the lease is free."""
    send, marks = trio.open_memory_channel[str](10)

    async def scans(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        send.send_nowait("start")
        task_status.started()
        try:
            await trio.sleep_forever()
        finally:
            send.send_nowait("stop")

    async def next_mark() -> str:
        with trio.fail_after(10):
            return await marks.receive()

    lease = fast_lease(ttl=0.4)
    with structlog.testing.capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            await nursery.start(serve_scan_leader, lease, db_dsn, scans)
            assert await next_mark() == "start"
            assert LEADER_GAUGES.standby is False
            other = LockConnection(db_dsn)
            with psycopg.connect(db_dsn, autocommit=True) as conn:  # frozen past its TTL
                conn.execute("UPDATE safetynet.leases SET expires_at = clock_timestamp()"
                             " WHERE job = %s", (SCAN_LEASE,))
            taken = await other.acquire(fast_lease(ttl=60))
            assert taken is not None
            assert await next_mark() == "stop"
            await wait_for(lambda: LEADER_GAUGES.standby)  # the step-down's last act
            with trio.move_on_after(0.5):  # several tries while the other holds it
                assert await marks.receive() is None, "led while another held the lease"
            await other.release(fast_lease(ttl=60), taken)
            assert await next_mark() == "start"
            assert LEADER_GAUGES.standby is False
            other.discard()
            nursery.cancel_scope.cancel()
    stepped = [e for e in logs if e["event"] == "scan_leader_stepped_down"]
    assert [e["reason"] for e in stepped] == ["renewal_refused"]
    assert [e["event"] for e in logs].count("scan_leader_elected") == 2


async def test_scan_leader_without_the_schema_backs_off_and_never_crashes(
        empty_db_dsn: str) -> None:
    """On a database without safetynet's schema the lease cannot be read: the actor
    stays a standby, retries with back-off and raises nothing (the scans never start)."""
    started: list[str] = []

    async def scans(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        started.append("start")
        task_status.started()

    with structlog.testing.capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            await nursery.start(serve_scan_leader, fast_lease(), empty_db_dsn, scans)
            await wait_for(lambda: sum(e["event"] == "lock_connection_failed"
                                       for e in logs) >= 3)
            nursery.cancel_scope.cancel()
    assert started == []
    assert LEADER_GAUGES.standby is True
    failed = [e for e in logs if e["event"] == "lock_connection_failed"]
    assert "does not exist" in failed[0]["error"]
