"""`safetynet run` under systemd's notify protocol: a real NOTIFY_SOCKET datagram socket
receives READY=1, WATCHDOG=1, RELOADING=1 and STOPPING=1 from a running daemon."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import tomli_w

from supervision.dev.s3 import S3Server
from tests.integration.app.test_reload import free_port

ROOT = Path(__file__).resolve().parents[3]


class NotifySocket:
    """The service manager's end: an abstract-namespace datagram socket."""

    def __init__(self) -> None:
        self.name = f"@safetynet-test-{uuid.uuid4().hex}"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind("\0" + self.name[1:])
        self.received: list[tuple[float, list[str]]] = []

    def wait_for(self, field: str, limit_s: float) -> float:
        """Read datagrams until one carries *field*; when it came (monotonic)."""
        deadline = time.monotonic() + limit_s
        while True:
            left = deadline - time.monotonic()
            assert left > 0, f"no {field} within {limit_s}s; got {self.received}"
            self.sock.settimeout(min(left, 0.5))
            try:
                data = self.sock.recv(4096)
            except TimeoutError:
                continue
            fields = data.decode().split("\n")
            self.received.append((time.monotonic(), fields))
            if field in fields:
                return self.received[-1][0]

    def fields_after(self, since: float) -> list[str]:
        return [f for at, fields in self.received if at > since for f in fields]

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def notify_socket() -> Iterator[NotifySocket]:
    sock = NotifySocket()
    yield sock
    sock.close()


def write_config(tmp_path: Path, dsn: str, s3: S3Server, bucket: str, port: int,
                 level: str = "info") -> Path:
    creds = s3.credentials
    config = tmp_path / "c.toml"
    config.write_text(tomli_w.dumps({
        "postgres": {"dsn": dsn},
        "s3": {"endpoint_url": s3.endpoint_url, "bucket": bucket, "region": creds.region,
               "access_key_id": creds.access_key_id,
               "secret_access_key": creds.secret_access_key},
        "jobs": {"conference_reaper": {"enabled": False}},
        "outbox_relay": {"enabled": False},
        "http": {"listen": f"127.0.0.1:{port}"},
        "supervision": {"shutdown_grace": "5s"},
        "logging": {"format": "json", "level": level},
    }))
    return config


def run_daemon(config: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with (config.parent / "daemon.log").open("wb") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "supervision.app", "run", "-c", str(config)], cwd=ROOT,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **env},
            stdout=log, stderr=subprocess.STDOUT)


def test_daemon_notifies_ready_watchdog_reloading_and_stopping_over_notify_socket(
        db_dsn: str, s3_server: S3Server, bucket: str, tmp_path: Path,
        notify_socket: NotifySocket) -> None:
    """READY=1 once the tree runs, WATCHDOG=1 at half of WATCHDOG_USEC, RELOADING=1 then
    READY=1 on SIGHUP, STOPPING=1 on SIGTERM and no WATCHDOG=1 after it; exit 0."""
    port = free_port()
    proc = run_daemon(write_config(tmp_path, db_dsn, s3_server, bucket, port),
                      {"NOTIFY_SOCKET": notify_socket.name, "WATCHDOG_USEC": "1000000"})
    try:
        ready = notify_socket.wait_for("READY=1", 30)
        notify_socket.wait_for("WATCHDOG=1", 5)
        first = notify_socket.wait_for("WATCHDOG=1", 5)
        second = notify_socket.wait_for("WATCHDOG=1", 5)
        assert 0.3 < second - first < 0.9  # every 0.5 s for WatchdogSec=1s
        assert any(f.startswith("STATUS=tree safetynet running")
                   for _, fields in notify_socket.received if _ >= ready for f in fields)

        write_config(tmp_path, db_dsn, s3_server, bucket, port, level="debug")
        proc.send_signal(signal.SIGHUP)
        reloading = notify_socket.wait_for("RELOADING=1", 10)
        assert any(f.startswith("MONOTONIC_USEC=") for f in notify_socket.received[-1][1])
        notify_socket.wait_for("READY=1", 30)
        assert reloading > ready

        proc.send_signal(signal.SIGTERM)
        stopping = notify_socket.wait_for("STOPPING=1", 10)
        assert proc.wait(timeout=30) == 0
        notify_socket.sock.setblocking(False)
        try:
            while data := notify_socket.sock.recv(4096):
                notify_socket.received.append((time.monotonic(), data.decode().split("\n")))
        except BlockingIOError:
            pass
        assert "WATCHDOG=1" not in notify_socket.fields_after(stopping)
    finally:
        proc.kill()
        proc.wait()


def test_watchdog_meant_for_another_pid_is_never_petted(
        db_dsn: str, s3_server: S3Server, bucket: str, tmp_path: Path,
        notify_socket: NotifySocket) -> None:
    """With WATCHDOG_PID naming another process, the daemon sends no WATCHDOG=1 (the
    watchdog is not meant for it), yet READY=1 and STOPPING=1 still arrive."""
    proc = run_daemon(write_config(tmp_path, db_dsn, s3_server, bucket, free_port()),
                      {"NOTIFY_SOCKET": notify_socket.name, "WATCHDOG_USEC": "200000",
                       "WATCHDOG_PID": "1"})
    try:
        ready = notify_socket.wait_for("READY=1", 30)
        proc.send_signal(signal.SIGTERM)
        notify_socket.wait_for("STOPPING=1", 10)
        assert proc.wait(timeout=30) == 0
        assert "WATCHDOG=1" not in notify_socket.fields_after(ready - 60)
    finally:
        proc.kill()
        proc.wait()
