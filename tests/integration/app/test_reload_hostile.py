"""SIGHUP with a hostile or broken file against a running `safetynet run` (issue #26): every
malformed value, an unreadable config path and an http.listen that cannot be bound are
refused with one ``config_reload_refused`` line naming the key; the daemon stays alive on
its old configuration; a listen address that can be bound moves without a gap."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from supervision.dev.s3 import S3Server
from tests.integration.app.test_reload import free_port, named, wait_for_event
from tests.integration.app.test_shutdown import ROOT, events

# (id, the layer's TOML, what the refused line starts with)
BROKEN = [
    ("ipv6-bracket", '[media]\nbase_url = "http://[::1"\n', "media.base_url: "),
    ("nested-5000", "[jobs.recording_finalize]\nbatch_size = " + "[" * 5000 + "]" * 5000
     + "\n", "jobs.recording_finalize.batch_size: "),
    ("datetime-duration", "[jobs.recording_finalize]\npolling_interval = "
     "1979-05-27T07:32:00Z\n", "jobs.recording_finalize.polling_interval: "),
    ("nul-ca-file", '[s3]\nca_file = "/tmp/a\\u0000b"\n', "s3.ca_file: "),
]


def healthz(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as resp:
        return int(resp.status)


@pytest.fixture
def daemon(db_dsn: str, s3_server: S3Server, bucket: str,
           tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A daemon on base.toml (recording-finalize every second) and layer.toml (empty)."""
    port = free_port()
    creds = s3_server.credentials
    base = {"postgres": {"dsn": db_dsn},
            "s3": {"endpoint_url": s3_server.endpoint_url, "bucket": bucket,
                   "region": creds.region, "access_key_id": creds.access_key_id,
                   "secret_access_key": creds.secret_access_key},
            "jobs": {"recording_finalize": {"polling_interval": "1s", "batch_size": 5},
                     "conference_reaper": {"enabled": False}},
            "outbox_relay": {"enabled": False},
            "http": {"listen": f"127.0.0.1:{port}"},
            "supervision": {"shutdown_grace": "5s"},
            "logging": {"format": "json", "level": "info"}}
    (tmp_path / "base.toml").write_text(tomli_w.dumps(base))
    layer = tmp_path / "layer.toml"
    layer.write_text("")
    log = tmp_path / "daemon.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "supervision.app", "run", "-c", str(tmp_path / "base.toml"),
             "-c", str(layer)], cwd=ROOT, env={"PATH": os.environ.get("PATH", "/usr/bin")},
            stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for_event(log, lambda ev: bool(named(ev, "cycle_completed")))
        yield {"proc": proc, "log": log, "layer": layer, "port": port}
    finally:
        proc.kill()
        proc.wait()


def refused_after(daemon: dict[str, Any], before: int) -> str:
    """SIGHUP, then the first new config_reload_refused line's problem."""
    log = daemon["log"]
    daemon["proc"].send_signal(signal.SIGHUP)
    wait_for_event(log, lambda ev: len(named(ev, "config_reload_refused")) > before)
    return str(named(events(log), "config_reload_refused")[before]["problem"])


def test_every_broken_reload_is_refused_naming_the_key_and_the_daemon_lives_on(
        daemon: dict[str, Any], tmp_path: Path) -> None:
    """A URL with an unclosed bracket, arrays nested 5,000 deep, a datetime as a duration,
    a NUL in a file name, a FIFO and a symlink to /dev/zero as the config file, and a busy
    port as http.listen: each SIGHUP is refused with a line naming the key (or the file),
    the daemon answers /healthz on its old port throughout, no tree is restarted; then
    SIGTERM still stops it with exit 0."""
    proc, log, layer, port = daemon["proc"], daemon["log"], daemon["layer"], daemon["port"]
    seen = 0
    for _, text, key in BROKEN:
        layer.write_text(text)
        assert refused_after(daemon, seen).startswith(key)
        seen = len(named(events(log), "config_reload_refused"))
        assert proc.poll() is None and healthz(port) == 200
    layer.unlink()
    os.mkfifo(layer)
    assert refused_after(daemon, seen).endswith("is a FIFO, not a regular file")
    seen = len(named(events(log), "config_reload_refused"))
    layer.unlink()
    layer.symlink_to("/dev/zero")
    assert "is a character device" in refused_after(daemon, seen)
    seen = len(named(events(log), "config_reload_refused"))
    layer.unlink()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        layer.write_text(f'[http]\nlisten = "127.0.0.1:{taken}"\n')
        assert refused_after(daemon, seen).startswith(f"http.listen: cannot bind 127.0.0.1:"
                                                      f"{taken}")
    assert proc.poll() is None and healthz(port) == 200
    logged = events(log)
    assert not named(logged, "config_reloaded") and not named(logged, "tree_restarted")
    assert all(e.get("level") != "critical" for e in logged)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0, log.read_text()[-3000:]


def test_a_reload_moving_http_listen_serves_on_the_new_port(daemon: dict[str, Any]) -> None:
    """A free new port is bound before the old tree stops: after the reload /healthz
    answers there and no longer on the old port."""
    proc, log, layer, port = daemon["proc"], daemon["log"], daemon["layer"], daemon["port"]
    new_port = free_port()
    layer.write_text(f'[http]\nlisten = "127.0.0.1:{new_port}"\n')
    proc.send_signal(signal.SIGHUP)
    wait_for_event(log, lambda ev: bool(named(ev, "tree_restarted")))
    deadline = time.monotonic() + 30
    while True:
        try:
            if healthz(new_port) == 200:
                break
        except OSError:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    with pytest.raises(OSError):
        healthz(port)
    (reloaded,) = named(events(log), "config_reloaded")
    assert reloaded["changed"] == ["http.listen"]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
