"""SIGHUP to `safetynet run` with changed resource settings: only the resource whose
section changed is closed and opened anew (a new S3 worker process, new PostgreSQL
backends, a new Kafka producer), the others keep their connections, and the daemon goes
on with the new settings; what would not load is refused and the old connections stay."""

from __future__ import annotations

import contextlib
import signal
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import psutil
import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from supervision.dev.kafka import KafkaServer
from supervision.dev.processes import DevStackError
from supervision.dev.s3 import S3Server
from tests.integration.app import test_reload
from tests.integration.app.test_reload import free_port, named, stop, wait_for_event
from tests.integration.app.test_shutdown import events
from tests.integration.outbox.test_outbox_relay import enqueue, unpublished
from tests.messenger import insert_call_session, insert_recording, upload_recording
from tests.waiting import wait_until

daemon_config, running = test_reload.daemon_config, test_reload.running  # fixtures


def s3_worker_pid(proc: Any) -> int:
    """The pid of the daemon's S3 worker process (it runs while the daemon uses S3)."""
    pids = [p.pid for p in psutil.Process(proc.pid).children()
            if "actors.s3.worker" in " ".join(p.cmdline())]
    assert len(pids) == 1, pids
    return pids[0]


def pool_backends(dsn: str, user: str | None = None) -> set[int]:
    """The backend pids of the daemon's connection pool (its application_name), of
    *user* only when given."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
            " AND application_name = 'safetynet' AND usename = coalesce(%s, usename)",
            (user,)).fetchall()
    return {int(row[0]) for row in rows}


def finalize_due_recording(dsn: str, s3_server: S3Server, bucket: str) -> str:
    """A lost callback whose binary is in *bucket*; the daemon reconciles it only when it
    reads that bucket."""
    # one transaction, committed once the binary is stored: a running daemon never sees
    # the row due without its binary (it would fail it as missing: a race, seen under load)
    with psycopg.connect(dsn) as conn:
        recording = insert_recording(conn, session_id=insert_call_session(conn))
        upload_recording(s3_server, recording.id, bucket=bucket)
    return recording.id


def recording_status(dsn: str, recording_id: str) -> str:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT status FROM messenger.call_recordings WHERE id = %s",
                           (recording_id,)).fetchone()
    assert row is not None
    return str(row[0])


def wait_available(dsn: str, recording_id: str) -> None:
    wait_until(lambda: recording_status(dsn, recording_id) != "Uploading", 60,
               "the recording to be finalised")
    assert recording_status(dsn, recording_id) == "Available"


@pytest.fixture
def second_bucket(s3_server: S3Server) -> str:
    name = f"rec-{uuid.uuid4().hex[:12]}"
    with contextlib.suppress(DevStackError):
        s3_server.create_bucket(name)
    return name


@pytest.fixture
def warmed(db_dsn: str, s3_server: S3Server, bucket: str, daemon_config: Any,
           running: Any, tmp_path: Path) -> Any:
    """A daemon cycling every second that has finalised one recording (its id is
    ``proc.finalised``): its S3 worker runs and its pool is connected."""
    proc = running(daemon_config({"polling_interval": "1s"}))
    proc.finalised = finalize_due_recording(db_dsn, s3_server, bucket)
    wait_available(db_dsn, proc.finalised)
    return proc


def test_sighup_with_a_new_s3_bucket_starts_a_new_s3_worker_and_keeps_the_pool(
        db_dsn: str, s3_server: S3Server, second_bucket: str, daemon_config: Any,
        warmed: Any, tmp_path: Path) -> None:
    """s3.bucket changed (to a copy of the bucket: the canary's known recording is
    there too): a recording whose binary is only in the new bucket is finalised as
    Available, by a new S3 worker process, while the pool's backends are the same."""
    log = tmp_path / "daemon.log"
    worker, backends = s3_worker_pid(warmed), pool_backends(db_dsn)
    upload_recording(s3_server, warmed.finalised, bucket=second_bucket)
    daemon_config({"polling_interval": "1s"}, s3={"bucket": second_bucket})
    warmed.send_signal(signal.SIGHUP)
    wait_for_event(log, lambda ev: bool(named(ev, "tree_restarted")))
    wait_available(db_dsn, finalize_due_recording(db_dsn, s3_server, second_bucket))
    logged = events(log)
    (reloaded,) = named(logged, "config_reloaded")
    assert reloaded["changed"] == ["s3.bucket"] and reloaded["reopened"] == ["s3"]
    assert [e["resources"] for e in named(logged, "resources_reopened")] == [["s3"]]
    assert not named(logged, "config_reload_needs_restart")
    assert s3_worker_pid(warmed) != worker
    assert backends <= pool_backends(db_dsn), "the pool kept its connections"
    stop(warmed, log)


def test_sighup_with_a_new_dsn_reconnects_the_pool_and_keeps_the_s3_worker(
        db_dsn: str, s3_server: S3Server, bucket: str, daemon_config: Any, warmed: Any,
        tmp_path: Path) -> None:
    """postgres.dsn changed to another role (a credential rotation): the old pool's
    backends are gone, new ones log in as the new role and finalise the next recording,
    and the S3 worker is the same process. The new password never reaches the log."""
    log = tmp_path / "daemon.log"
    worker, backends = s3_worker_pid(warmed), pool_backends(db_dsn)
    assert backends
    role, password = f"rotated_{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN SUPERUSER PASSWORD {}").format(
            sql.Identifier(role), sql.Literal(password)))
    params = conninfo_to_dict(db_dsn)
    rotated = make_conninfo(db_dsn, user=role, password=password)
    daemon_config({"polling_interval": "1s"}, postgres={"dsn": rotated})
    warmed.send_signal(signal.SIGHUP)
    wait_for_event(log, lambda ev: bool(named(ev, "tree_restarted")))
    wait_available(db_dsn, finalize_due_recording(db_dsn, s3_server, bucket))
    wait_until(lambda: not backends & pool_backends(db_dsn), 30, "the old pool to close")
    assert pool_backends(db_dsn, user=role), "the new pool logs in as the new role"
    logged = events(log)
    (reloaded,) = named(logged, "config_reloaded")
    assert reloaded["changed"] == ["postgres.dsn"] and reloaded["reopened"] == ["postgres"]
    assert s3_worker_pid(warmed) == worker
    text = log.read_text()
    assert password not in text and params["password"] not in text
    stop(warmed, log)


def test_sighup_with_a_media_ca_file_that_does_not_load_is_refused(
        db_dsn: str, daemon_config: Any, warmed: Any, tmp_path: Path) -> None:
    """media.ca_file names no PEM bundle: config_reload_refused names the key, nothing
    restarts, and the S3 worker and the pool's backends are the same as before."""
    log = tmp_path / "daemon.log"
    worker, backends = s3_worker_pid(warmed), pool_backends(db_dsn)
    bad = tmp_path / "ca.pem"
    bad.write_text("not a certificate\n")
    daemon_config({"polling_interval": "1s", "batch_size": 7}, media={"ca_file": str(bad)})
    warmed.send_signal(signal.SIGHUP)
    wait_for_event(log, lambda ev: bool(named(ev, "config_reload_refused")))
    logged = events(log)
    assert [e["problem"] for e in named(logged, "config_reload_refused")] == [
        f"media.ca_file: cannot load {str(bad)!r}: not a PEM bundle of CA certificates"]
    assert not named(logged, "config_reloaded") and not named(logged, "tree_restarted")
    assert s3_worker_pid(warmed) == worker
    assert backends <= pool_backends(db_dsn)
    assert warmed.poll() is None
    stop(warmed, log)


def test_sighup_with_a_reachable_kafka_bootstrap_publishes_what_waited(
        db_dsn: str, kafka_server: KafkaServer, daemon_config: Any, running: Any,
        tmp_path: Path) -> None:
    """kafka.bootstrap_servers first names a port where no broker listens: the outbox
    rows wait. After SIGHUP with the broker's address a new producer publishes them,
    while the pool keeps its backends."""
    log = tmp_path / "daemon.log"
    relay = {"enabled": True, "poll_interval": "1s"}
    proc = running(daemon_config({"polling_interval": "1s"}, outbox_relay=relay,
                                 kafka={"bootstrap_servers": f"127.0.0.1:{free_port()}"}))
    enqueue(db_dsn, f"test.reload.{uuid.uuid4().hex[:10]}", ["k1", "k2", "k3"])
    wait_for_event(log, lambda ev: bool(named(ev, "kafka_unavailable")))
    assert len(unpublished(db_dsn)) == 3
    backends = pool_backends(db_dsn)
    daemon_config({"polling_interval": "1s"}, outbox_relay=relay,
                  kafka={"bootstrap_servers": kafka_server.bootstrap_servers})
    proc.send_signal(signal.SIGHUP)
    wait_until(lambda: not unpublished(db_dsn), 60, "the relay to publish")
    logged = events(log)
    (reloaded,) = named(logged, "config_reloaded")
    assert reloaded["reopened"] == ["kafka"]
    assert backends <= pool_backends(db_dsn)
    stop(proc, log)


def readyz(port: int) -> int:
    """/readyz's status; 0 while nothing answers (the moment between two trees)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:  # refused, or cut while the exporter stops
        return 0


def test_sighup_with_a_dsn_nothing_answers_keeps_the_daemon_up_until_a_good_one(
        db_dsn: str, s3_server: S3Server, bucket: str, daemon_config: Any, warmed: Any,
        tmp_path: Path) -> None:
    """A new DSN naming a port where no PostgreSQL listens is applied (it cannot be
    judged without connecting): /readyz answers 503 and the process stays up; a SIGHUP
    with the good DSN again brings /readyz back to 200 and the next recording is
    finalised."""
    log = tmp_path / "daemon.log"
    port = daemon_config.port
    nowhere = make_conninfo(db_dsn, port=str(free_port()))
    daemon_config({"polling_interval": "1s"}, postgres={"dsn": nowhere})
    warmed.send_signal(signal.SIGHUP)
    wait_until(lambda: readyz(port) == 503, 60, "/readyz to answer 503")
    assert warmed.poll() is None
    daemon_config({"polling_interval": "1s"})
    warmed.send_signal(signal.SIGHUP)
    wait_until(lambda: readyz(port) == 200, 60, "/readyz to answer 200 again")
    wait_available(db_dsn, finalize_due_recording(db_dsn, s3_server, bucket))
    reloads = named(events(log), "config_reloaded")
    assert [e["reopened"] for e in reloads] == [["postgres"], ["postgres"]]
    assert warmed.poll() is None
    stop(warmed, log)
