"""`safetynet pause` / `safetynet resume` (issue #18): the CLI against a real database, and a
real `safetynet run` whose paused job stops while the others go on."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import tomli_w

from supervision.dev.ports import free_ports
from supervision.dev.s3 import S3Server
from tests.cli import cli, postgres_only_config
from tests.integration.app.test_shutdown import events, start_daemon
from tests.messenger import attempt, insert_call_session, insert_recording
from tests.waiting import wait_until

FINALIZE, REAPER = "recording-finalize", "conference-reaper"


@pytest.fixture
def config(db_dsn: str, tmp_path: Path) -> Path:
    return postgres_only_config(tmp_path, db_dsn)


def dsn_user(config: Path) -> str:
    """The role the configuration's DSN logs in as."""
    import psycopg

    from supervision.app.settings import load_config

    with psycopg.connect(load_config([config], {}).postgres.dsn.reveal()) as conn:
        row = conn.execute("SELECT session_user::text").fetchone()
    assert row is not None
    return str(row[0])


def test_pause_shows_in_status_until_resume(config: Path) -> None:
    """pause records the job, reason and who; status (table and --json) lists it; a
    second pause keeps the first; resume ends it, and a second resume says so."""
    first = cli(config, "pause", "--job", FINALIZE, "--reason", "S3 migration")
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith(f"paused {FINALIZE} (since ")
    again = cli(config, "pause", "--job", FINALIZE, "--reason", "other")
    assert again.returncode == 0 and "was already paused" in again.stdout
    assert again.stdout.rstrip().endswith(": S3 migration")

    data = json.loads(cli(config, "status", "--json").stdout)
    (paused,) = data["paused"]
    assert (paused["job"], paused["reason"]) == (FINALIZE, "S3 migration")
    assert "@" in paused["paused_by"] and paused["paused_for_seconds"] >= 0
    assert paused["paused_by"].endswith(f" [db:{dsn_user(config)}]")  # not only $USER
    assert "paused jobs" in cli(config, "status").stdout

    resumed = cli(config, "resume", "--job", FINALIZE)
    assert resumed.returncode == 0 and resumed.stdout.startswith(f"resumed {FINALIZE}")
    assert json.loads(cli(config, "status", "--json").stdout)["paused"] == []
    assert cli(config, "resume", "--job", FINALIZE).stdout == f"{FINALIZE} was not paused\n"


def test_pause_of_an_unknown_job_exits_2_and_changes_nothing(config: Path) -> None:
    """A job name that is not one of the daemon's jobs is a usage error (exit 2)."""
    proc = cli(config, "pause", "--job", "recording-finalise")
    assert proc.returncode == 2
    assert "recording-finalise" in proc.stderr
    assert json.loads(cli(config, "status", "--json").stdout)["paused"] == []


def daemon_config(path: Path, dsn: str, s3: S3Server, bucket: str, port: int) -> Path:
    creds = s3.credentials
    path.write_text(tomli_w.dumps({
        "postgres": {"dsn": dsn},
        "s3": {"endpoint_url": s3.endpoint_url, "bucket": bucket, "region": creds.region,
               "access_key_id": creds.access_key_id,
               "secret_access_key": creds.secret_access_key},
        "jobs": {"recording_finalize": {"polling_interval": "1s", "finalize_sla_timeout": 0},
                 "conference_reaper": {"polling_interval": "1s"}},
        "outbox_relay": {"enabled": False},
        "http": {"listen": f"127.0.0.1:{port}"},
        "supervision": {"shutdown_grace": "5s"},
        "logging": {"format": "json"},
    }))
    return path


def job_events(log: Path, event: str, job: str) -> list[dict[str, Any]]:
    return [e for e in events(log) if e.get("event") == event and e.get("job") == job]


def paused_gauge(url: str, job: str) -> str | None:
    line = f'safetynet_job_paused{{job="{job}"}} '
    for row in httpx.get(f"{url}/metrics", timeout=2).text.splitlines():
        if row.startswith(line):
            return row[len(line):]
    return None


def test_paused_job_stops_on_a_running_daemon_while_others_run_then_resumes(
        db_dsn: str, s3_server: S3Server, bucket: str, tmp_path: Path) -> None:
    """On a running daemon, pausing recording-finalize stops its cycles at the next tick
    (one cycle_skipped_paused, however many ticks; /metrics shows it paused) while the
    conference reaper keeps completing cycles; a due row waits. After resume the job runs
    again and finalises the row."""
    port = free_ports(1)[0]
    url = f"http://127.0.0.1:{port}"
    config = daemon_config(tmp_path / "c.toml", db_dsn, s3_server, bucket, port)
    log = tmp_path / "daemon.log"
    proc = start_daemon(config, log)
    try:
        wait_until(lambda: len(job_events(log, "cycle_completed", FINALIZE)) >= 1, 30,
                   "a first recording-finalize cycle")
        assert cli(config, "pause", "--job", FINALIZE, "--reason", "test").returncode == 0
        wait_until(lambda: job_events(log, "cycle_skipped_paused", FINALIZE), 20,
                   "the keeper to honour the pause")
        skipped_at = len(events(log))
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            rec = insert_recording(conn, session_id=insert_call_session(conn))
        reaper_before = len(job_events(log, "cycle_completed", REAPER))
        wait_until(lambda: len(job_events(log, "cycle_completed", REAPER))
                   >= reaper_before + 4, 30, "four more conference-reaper cycles")
        assert paused_gauge(url, FINALIZE) == "1.0"
        assert paused_gauge(url, REAPER) == "0.0"
        after_pause = events(log)[skipped_at:]
        assert [e for e in after_pause if e.get("job") == FINALIZE
                and e.get("event") in ("cycle_started", "cycle_completed")] == []
        assert len(job_events(log, "cycle_skipped_paused", FINALIZE)) == 1
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            assert attempt(conn, rec.id)["status"] == "Pending"

            assert cli(config, "resume", "--job", FINALIZE).returncode == 0
            wait_until(lambda: attempt(conn, rec.id)["status"] == "Done", 30,
                       "the resumed job to finalise the row")
        assert job_events(log, "job_resumed", FINALIZE)
        assert paused_gauge(url, FINALIZE) == "0.0"
    finally:
        proc.terminate()
        proc.wait(timeout=15)
