"""SIGHUP to `safetynet run` (a real daemon process): a valid file applies without a
restart, an invalid one is refused and the running configuration stays."""

from __future__ import annotations

import signal
import socket
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import tomli_w

from supervision.dev.s3 import S3Server
from tests.integration.app.test_shutdown import DONE, events, seed_lost_callbacks, start_daemon
from tests.integration.app.test_shutdown import wait_for as wait_for_rows
from tests.messenger import conference, insert_conference

Event = dict[str, Any]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def daemon_config(db_dsn: str, s3_server: S3Server, bucket: str,
                  tmp_path: Path) -> Callable[..., Path]:
    """Writes c.toml: recording-finalize (and optionally the reaper) against the test
    servers; *rf*, *cr*, *level* and *sections* (keys merged into a section) vary what a
    reload changes."""
    port = free_port()
    creds = s3_server.credentials

    def write(rf: dict[str, Any], cr: dict[str, Any] | None = None,
              level: str = "info", **sections: dict[str, Any]) -> Path:
        path = tmp_path / "c.toml"
        raw: dict[str, Any] = {
            "postgres": {"dsn": db_dsn},
            "s3": {"endpoint_url": s3_server.endpoint_url, "bucket": bucket,
                   "region": creds.region, "access_key_id": creds.access_key_id,
                   "secret_access_key": creds.secret_access_key},
            "jobs": {"recording_finalize": {"lock_ttl": "3m", "max_run_duration": "2m", **rf},
                     "conference_reaper": cr or {"enabled": False}},
            "outbox_relay": {"enabled": False},
            "http": {"listen": f"127.0.0.1:{port}"},
            "supervision": {"shutdown_grace": "5s"},
            "logging": {"format": "json", "level": level},
        }
        for section, values in sections.items():
            raw[section] = {**raw.get(section, {}), **values}
        path.write_text(tomli_w.dumps(raw))
        return path
    write.port = port  # type: ignore[attr-defined]
    return write


@pytest.fixture
def running(tmp_path: Path) -> Iterator[Callable[[Path], Any]]:
    procs = []

    def start(config: Path) -> Any:
        proc = start_daemon(config, tmp_path / "daemon.log")
        procs.append(proc)
        return proc
    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


def wait_for_event(log: Path, match: Callable[[list[Event]], bool], limit_s: float = 60) -> None:
    deadline = time.monotonic() + limit_s
    while not match(events(log)):
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.05)


def named(log_events: list[Event], name: str) -> list[Event]:
    return [e for e in log_events if e.get("event") == name]


def after(log_events: list[Event], name: str) -> list[Event]:
    """The events logged after the last *name* event."""
    index = max(i for i, e in enumerate(log_events) if e.get("event") == name)
    return log_events[index + 1:]


def finalize_runs(port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("messenger_recording_finalize_run_total{"))


def stop(proc: Any, log: Path) -> None:
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0, log.read_text()[-3000:]


def test_sighup_applies_log_level_interval_and_batch_size_in_the_same_process(
        db_dsn: str, daemon_config: Any, running: Any, tmp_path: Path) -> None:
    """At warning level, a 1h interval and batches of 5, rows seeded after the first
    cycle wait; after SIGHUP with info, 1s and 7 the same process logs at info, cycles
    again within seconds and claims in batches of 7."""
    log = tmp_path / "daemon.log"
    proc = running(daemon_config({"polling_interval": "1h", "batch_size": 5},
                                 level="warning"))
    deadline = time.monotonic() + 60
    while True:  # the first cycle (0.5 s after start) has run; the next is 1 h away
        try:
            if finalize_runs(daemon_config.port) >= 1:
                break
        except OSError:
            pass
        assert time.monotonic() < deadline and proc.poll() is None, log.read_text()[-3000:]
        time.sleep(0.05)
    seed_lost_callbacks(db_dsn, 40)
    assert not named(events(log), "daemon_started"), "info lines are off at warning"
    daemon_config({"polling_interval": "1s", "batch_size": 7}, level="info")
    proc.send_signal(signal.SIGHUP)
    wait_for_rows(db_dsn, DONE, 40)
    assert proc.poll() is None
    logged = events(log)
    (reloaded,) = named(logged, "config_reloaded")
    assert set(reloaded["changed"]) == {"jobs.recording_finalize.polling_interval",
                                        "jobs.recording_finalize.batch_size",
                                        "logging.level"}
    batches = [e["rows"] for e in named(after(logged, "config_reloaded"), "batch_claimed")]
    assert batches and max(batches) == 7 and sum(batches) >= 40
    stop(proc, log)


def test_sighup_with_an_invalid_file_is_refused_and_the_running_config_stays(
        db_dsn: str, daemon_config: Any, running: Any, tmp_path: Path) -> None:
    """A bad batch size and a bad log level: one config_reload_refused line each, no
    restart, and the daemon goes on with its old batches of 5."""
    log = tmp_path / "daemon.log"
    proc = running(daemon_config({"polling_interval": "1s", "batch_size": 5}))
    wait_for_event(log, lambda ev: bool(named(ev, "cycle_completed")))
    daemon_config({"polling_interval": "1s", "batch_size": 0}, level="loud")
    proc.send_signal(signal.SIGHUP)
    wait_for_event(log, lambda ev: len(named(ev, "config_reload_refused")) >= 2)
    problems = [e["problem"] for e in named(events(log), "config_reload_refused")]
    assert len(problems) == 2
    assert any("batch_size" in p for p in problems) and any("level" in p for p in problems)
    seed_lost_callbacks(db_dsn, 30)
    wait_for_rows(db_dsn, DONE, 30)
    logged = events(log)
    assert not named(logged, "tree_restarted") and not named(logged, "config_reloaded")
    batches = [e["rows"] for e in named(logged, "batch_claimed")]
    assert max(batches) == 5
    assert proc.poll() is None
    stop(proc, log)


def test_sighup_with_a_job_disabled_stops_its_keeper(
        db_dsn: str, daemon_config: Any, running: Any, tmp_path: Path) -> None:
    """conference-reaper enabled=false: after the reload, while recording-finalize goes
    on cycling every second, the reaper (also every second before) runs no cycle and a
    due empty room stays Active."""
    log = tmp_path / "daemon.log"
    reaper = {"polling_interval": "1s", "empty_room_grace": "90s"}
    proc = running(daemon_config({"polling_interval": "1s"}, {"enabled": True, **reaper}))
    wait_for_event(log, lambda ev: any("empty_timeout" in e
                                       for e in named(ev, "cycle_completed")))
    daemon_config({"polling_interval": "1s"}, {"enabled": False, **reaper})
    proc.send_signal(signal.SIGHUP)
    wait_for_event(log, lambda ev: bool(named(ev, "tree_restarted")))
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        room = insert_conference(conn, last_activity_ago=3600)

    def finalize_cycles_since_reload(ev: list[Event]) -> int:
        return sum(1 for e in named(after(ev, "tree_restarted"), "cycle_completed")
                   if "reconciled" in e)
    wait_for_event(log, lambda ev: finalize_cycles_since_reload(ev) >= 3)
    logged = events(log)
    (reloaded,) = named(logged, "config_reloaded")
    assert reloaded["changed"] == ["jobs.conference_reaper.enabled"]
    assert not any("empty_timeout" in e
                   for e in named(after(logged, "tree_restarted"), "cycle_completed"))
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        assert conference(conn, room.id)["status"] == "Active"
    stop(proc, log)
