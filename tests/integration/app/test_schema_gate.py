"""The daemon's schema/version gate is never skipped (issue 36, item 8), with a real daemon:
PostgreSQL unreachable at start keeps every job waiting (``/readyz`` 503 naming why) until
the check runs, as soon as PostgreSQL answers; SIGHUP checks again; the three schema
gauges follow what the check found."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path
from typing import Any

import httpx
import psycopg
import tomli_w
import trio
from prometheus_client.parser import text_string_to_metric_families
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from supervision.db.migrate import migrate
from supervision.dev.ports import free_ports
from supervision.dev.s3 import S3Server
from tests.faults import open_fault_proxy
from tests.integration.app.test_shutdown import events, start_daemon
from tests.waiting import wait_until

BREAK_REAPER = ("ALTER TABLE messenger.conference_sessions ALTER COLUMN last_activity_at"
                " TYPE timestamp")
MEND_REAPER = ("ALTER TABLE messenger.conference_sessions ALTER COLUMN last_activity_at"
               " TYPE timestamptz")


def write_config(path: Path, dsn: str, s3: S3Server, bucket: str, port: int) -> Path:
    creds = s3.credentials
    path.write_text(tomli_w.dumps({
        "postgres": {"dsn": dsn, "connect_timeout": "2s"},
        "s3": {"endpoint_url": s3.endpoint_url, "bucket": bucket, "region": creds.region,
               "access_key_id": creds.access_key_id,
               "secret_access_key": creds.secret_access_key},
        "jobs": {"recording_finalize": {"polling_interval": "1s"},
                 "conference_reaper": {"polling_interval": "1s"}},
        "outbox_relay": {"enabled": False},
        "http": {"listen": f"127.0.0.1:{port}"},
        "supervision": {"shutdown_grace": "5s"},
        "logging": {"format": "json"},
    }))
    return path


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def gauge(port: int, name: str, **labels: str) -> float | None:
    return scrape(port).get((name, tuple(sorted(labels.items()))))


def readyz(port: int) -> tuple[int, str]:
    try:
        answer = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5)
    except httpx.HTTPError:
        return 0, ""
    return answer.status_code, answer.text


def named(log: Path, name: str, **fields: Any) -> list[dict[str, Any]]:
    return [e for e in events(log) if e.get("event") == name
            and all(e.get(k) == v for k, v in fields.items())]


def cycles(log: Path, job: str) -> int:
    return len(named(log, "cycle_started", job=job))


def stop(proc: subprocess.Popen[bytes], log: Path) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        assert proc.wait(timeout=30) == 0, log.read_text()[-3000:]
    finally:
        proc.kill()


async def test_jobs_wait_for_the_gate_while_postgres_is_unreachable_at_start(
        db_dsn: str, s3_server: S3Server, bucket: str, tmp_path: Path) -> None:
    """PostgreSQL refused at start (the reaper's column broken meanwhile): no job starts a
    cycle, /readyz is 503 saying PostgreSQL is unavailable and the gate fault is set; once
    it answers the gate runs before any cycle and its verdict holds — recording-finalize
    cycles, the reaper never does, /readyz names its column."""
    info = conninfo_to_dict(db_dsn)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute(BREAK_REAPER)
    async with open_fault_proxy("127.0.0.1", int(str(info["port"]))) as proxy:
        proxy.down = True
        dsn = make_conninfo("", **{**info, "host": "127.0.0.1", "port": str(proxy.port)})
        port = free_ports(1)[0]
        config = write_config(tmp_path / "c.toml", dsn, s3_server, bucket, port)
        log = tmp_path / "daemon.log"
        proc = start_daemon(config, log)
        try:
            await trio.to_thread.run_sync(lambda: wait_until(
                lambda: len(named(log, "schema_check_deferred")) >= 2, 60,
                "the deferred check tried twice"))
            status, text = await trio.to_thread.run_sync(readyz, port)
            assert status == 503 and text.startswith("not ready: postgres unavailable")
            faults = await trio.to_thread.run_sync(
                lambda: gauge(port, "safetynet_config_fault", component="schema-gate"))
            assert faults == 1
            assert named(log, "cycle_started") == []
            proxy.down = False
            await trio.to_thread.run_sync(lambda: wait_until(
                lambda: cycles(log, "recording-finalize") >= 2, 60,
                "two recording-finalize cycles after PostgreSQL came back"))
            (passed,) = named(log, "schema_gate_passed")
            assert passed["excluded"] == ["conference-reaper"]
            seen = events(log)
            first_cycle = next(i for i, e in enumerate(seen) if e.get("event") == "cycle_started")
            assert seen.index(passed) < first_cycle
            assert cycles(log, "conference-reaper") == 0
            status, text = await trio.to_thread.run_sync(readyz, port)
            assert status == 503
            assert "messenger.conference_sessions.last_activity_at" in text
            broken = await trio.to_thread.run_sync(lambda: scrape(port))
            assert broken[("safetynet_schema_contract_broken",
                           (("job", "conference-reaper"),))] == 1
            assert broken[("safetynet_config_fault", (("component", "schema-gate"),))] == 0
        finally:
            await trio.to_thread.run_sync(stop, proc, log)


def test_sighup_checks_the_schema_again_and_the_three_gauges_follow(
        db_dsn: str, s3_server: S3Server, bucket: str, tmp_path: Path) -> None:
    """A recommended index missing, a migration of a newer release in the ledger and the
    reaper's column broken: the gauges say 1, 1 and 1 (recording-finalize 0) and the reaper
    does not run; all three mended and a SIGHUP: 0, 0, 0, the reaper runs, /readyz 200."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("DROP INDEX messenger.ix_recording_file_id")
        conn.execute("INSERT INTO safetynet.schema_migrations (version, name, checksum)"
                     " VALUES (9999, 'from_the_future', 'x')")
        conn.execute(BREAK_REAPER)
    port = free_ports(1)[0]
    config = write_config(tmp_path / "c.toml", db_dsn, s3_server, bucket, port)
    log = tmp_path / "daemon.log"
    proc = start_daemon(config, log)
    try:
        wait_until(lambda: cycles(log, "recording-finalize") >= 1, 60, "a finalize cycle")
        found = scrape(port)
        assert found[("safetynet_schema_missing_indexes", ())] == 1
        assert found[("safetynet_schema_migrations_ahead", ())] == 1
        assert found[("safetynet_schema_contract_broken", (("job", "conference-reaper"),))] == 1
        assert found[("safetynet_schema_contract_broken", (("job", "recording-finalize"),))] == 0
        assert readyz(port)[0] == 503 and cycles(log, "conference-reaper") == 0
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            conn.execute("DELETE FROM safetynet.schema_migrations WHERE version = 9999")
            conn.execute(MEND_REAPER)
        assert [s.label for s in migrate(db_dsn)] == ["index ix_recording_file_id"]
        proc.send_signal(signal.SIGHUP)
        wait_until(lambda: cycles(log, "conference-reaper") >= 1, 60,
                   "a reaper cycle after the SIGHUP")
        mended = scrape(port)
        assert mended[("safetynet_schema_missing_indexes", ())] == 0
        assert mended[("safetynet_schema_migrations_ahead", ())] == 0
        assert mended[("safetynet_schema_contract_broken", (("job", "conference-reaper"),))] == 0
        wait_until(lambda: readyz(port)[0] == 200, 30, "/readyz 200 after the SIGHUP")
    finally:
        stop(proc, log)
