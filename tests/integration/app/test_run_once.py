"""`safetynet run-once`: one JSON line with SPEC §7's keys for each job, exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
import tomli_w

from supervision.dev.kafka import KafkaServer
from supervision.dev.s3 import S3Server
from tests.messenger import insert_call_session, insert_recording

ROOT = Path(__file__).resolve().parents[3]
KEYS = {
    "recording-finalize": {"reconciled", "republished", "failed", "quarantined", "transient",
                           "skipped_locked", "duration_ms"},
    "conference-reaper": {"empty_timeout", "provision_failed", "stale_timeout",
                          "skipped_locked", "errors", "duration_ms"},
    "outbox-relay": {"published", "failed", "duration_ms"},
}


@pytest.mark.parametrize("job", sorted(KEYS))
def test_run_once_prints_one_json_line_with_the_spec_keys(
        job: str, db_dsn: str, s3_server: S3Server, kafka_server: KafkaServer, bucket: str,
        tmp_path: Path) -> None:
    """Each job's counts carry at least SPEC §7's keys; the finalize cycle's count the
    work it did (one recording failed for lack of a binary)."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        insert_recording(conn, session_id=insert_call_session(conn), status="Recording")
    creds = s3_server.credentials
    config = tmp_path / "c.toml"
    config.write_text(tomli_w.dumps({
        "postgres": {"dsn": db_dsn},
        "kafka": {"bootstrap_servers": kafka_server.bootstrap_servers},
        "s3": {"endpoint_url": s3_server.endpoint_url, "bucket": bucket,
               "access_key_id": creds.access_key_id,
               "secret_access_key": creds.secret_access_key},
        "logging": {"level": "warning"},
    }))
    proc = subprocess.run([sys.executable, "-m", "supervision.app", "run-once", "--job", job,
                           "-c", str(config)], capture_output=True, text=True, cwd=ROOT,
                          check=False, env={"PATH": os.environ.get("PATH", "")})
    assert proc.returncode == 0, proc.stderr[-2000:]
    (line,) = proc.stdout.splitlines()
    counts = json.loads(line)
    assert KEYS[job] <= set(counts)
    if job == "recording-finalize":
        assert counts["failed"] == 1 and counts["reconciled"] == 0


def test_run_once_against_a_dead_database_exits_1(tmp_path: Path) -> None:
    """Infrastructure failure: exit 1 and one error line, no traceback."""
    config = tmp_path / "c.toml"
    config.write_text(tomli_w.dumps({
        "postgres": {"dsn": "postgresql://u:pw@127.0.0.1:1/x?connect_timeout=1"}}))
    proc = subprocess.run([sys.executable, "-m", "supervision.app", "run-once", "--job",
                           "conference-reaper", "-c", str(config)], capture_output=True,
                          text=True, cwd=ROOT, check=False,
                          env={"PATH": os.environ.get("PATH", "")}, timeout=60)
    assert proc.returncode == 1
    *logs, last = proc.stderr.splitlines()
    assert last.startswith("error: ") and "Traceback" not in proc.stderr
    assert all(json.loads(line)["level"] for line in logs), "every other line is JSON"
