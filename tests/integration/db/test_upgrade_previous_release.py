"""Upgrades keep the runtime role working (issue 36, item 2): a database installed by the
previous release (the wheel of commit 29e8e5b, migrations up to 0013) and its runtime role
granted by that release's `migrate --grant-to`; then today's `migrate` with no grant flag
(as the Kubernetes Job runs it), across migrations that add tables; then every job, as
that role, does its work."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
import tomli_w

from supervision.dev.kafka import KafkaServer
from supervision.dev.s3 import S3Server
from tests.cli import cli
from tests.integration.db.test_install import s3_settings
from tests.integration.db.test_print_sql import new_role
from tests.messenger import (
    insert_call_session,
    insert_conference,
    insert_recording,
    upload_recording,
)
from tests.releases import release_site

PREVIOUS = "29e8e5b"  # the release before issue 36 (migrations up to 0013)


@pytest.fixture(scope="module")
def previous_release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Commit 29e8e5b built into a wheel and installed with --no-deps into a directory of
    its own (its dependencies are this venv's)."""
    return release_site(PREVIOUS, tmp_path_factory.mktemp("previous-release"))


def previous_cli(site: Path, config: Path, *args: str,
                 cwd: Path) -> subprocess.CompletedProcess[str]:
    """A verb of the previous release (its own package first on the path)."""
    return subprocess.run([sys.executable, "-m", "supervision.app", *args, "-c", str(config)],
                          capture_output=True, text=True, cwd=cwd, check=False,
                          env={"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(site)})


def test_a_role_granted_by_the_previous_release_runs_every_job_after_the_upgrade(
        previous_release: Path, empty_db_dsn: str, s3_server: S3Server, bucket: str,
        kafka_server: KafkaServer, tmp_path: Path) -> None:
    owner = tmp_path / "owner.toml"
    owner.write_text(tomli_w.dumps({"postgres": {"dsn": empty_db_dsn}}))
    role, role_dsn = new_role(empty_db_dsn, "sn_rt")
    old = previous_cli(previous_release, owner, "migrate", "--messenger-fixture",
                       "--grant-to", role, cwd=tmp_path)
    assert old.returncode == 0, old.stderr[-2000:]
    with psycopg.connect(empty_db_dsn) as conn:
        assert max(r[0] for r in conn.execute(
            "SELECT version FROM safetynet.schema_migrations")) == 13
    upgraded = cli(owner, "migrate")  # no --grant-to: the Kubernetes migration Job
    assert upgraded.returncode == 0, upgraded.stderr[-2000:]
    assert "applied 0014_" in upgraded.stdout and "applied 0017_" in upgraded.stdout
    assert f"applied grants to {role}" in upgraded.stdout  # adopted, then granted
    with psycopg.connect(empty_db_dsn, autocommit=True) as conn:
        rec = insert_recording(conn, session_id=insert_call_session(conn))
        conf = insert_conference(conn, status="Active", last_activity_ago=7200)
    upload_recording(s3_server, rec.id, bucket=bucket)
    config = tmp_path / "runtime.toml"
    config.write_text(tomli_w.dumps({
        "postgres": {"dsn": role_dsn}, "s3": s3_settings(s3_server, bucket),
        "kafka": {"bootstrap_servers": kafka_server.bootstrap_servers},
        "jobs": {"recording_finalize": {"finalize_sla_timeout": "30m"}}}))
    for job in ("recording-finalize", "conference-reaper", "outbox-relay"):
        proc = cli(config, "plan", "--job", job)
        assert proc.returncode == 0, (job, proc.stderr[-2000:])
        proc = cli(config, "run-once", "--job", job)
        assert proc.returncode == 0, (job, proc.stderr[-2000:])
    with psycopg.connect(empty_db_dsn) as conn:
        assert conn.execute("SELECT status FROM messenger.call_recordings WHERE id = %s",
                            (rec.id,)).fetchone() == ("Available",)
        assert conn.execute("SELECT status FROM messenger.conference_sessions WHERE id = %s",
                            (conf.id,)).fetchone() == ("Ended",)
        assert conn.execute("SELECT count(*) FROM messenger.integration_outbox"
                            " WHERE published_at IS NULL").fetchone() == (0,)
        # the previous release's whole-table grants narrowed to the contract's columns
        assert conn.execute("SELECT has_table_privilege(%s, 'messenger.call_recordings',"
                            " 'SELECT')", (role,)).fetchone() == (False,)
