"""Instance metadata (IMDSv2) as the daemon's only source of S3 keys, against a SeaweedFS
that refuses unsigned requests and requires the session token of temporary keys.

``tests/imds_stub.py`` stands in for the metadata service on loopback
(``AWS_EC2_METADATA_SERVICE_ENDPOINT``) and hands out session credentials SeaweedFS's own
STS issued. What ``tests/integration/s3/test_s3_cloud_credentials.py`` already shows — an
outage at the first request heals in the same object store — is not repeated; here: the
real ``safetynet run-once`` process gets role keys through botocore's chain (IMDSv2: a
session token first, sent on every read) and reconciles with them; and keys rotated at
the metadata service reach the running worker without a restart, once botocore's clock
says they are due for renewal.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import botocore.credentials
import httpx
import psycopg
import pytest
import tomli_w
import trio

from actors.s3.credentials import CredentialSource, resolve_chain
from actors.s3.objectstore import Found
from actors.s3.process import open_object_store
from supervision.config import S3Config
from tests.faults import put_recordings
from tests.imds_stub import CREDS_PATH, ROLE, SESSION_TOKEN, serve_imds
from tests.messenger import PREFIX, insert_call_session, insert_recording, recording
from tests.secure_s3 import SECURE_BUCKET, SecureS3, open_secure_s3

ROOT = Path(__file__).resolve().parents[3]
PRESENT = [str(uuid.uuid4()) for _ in range(4)]
CHAIN_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
             "AWS_EC2_METADATA_DISABLED", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN",
             "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI")


@pytest.fixture(scope="module")
def secure_s3(stack_dir: Path) -> Iterator[SecureS3]:
    with open_secure_s3(stack_dir / f"imds-s3-{uuid.uuid4().hex[:6]}") as s3:
        trio.run(put_recordings, s3.server, SECURE_BUCKET, PRESENT)
        yield s3


def imds_environment(endpoint: str, home: Path) -> dict[str, str]:
    """botocore's chain with nothing but the metadata service to find."""
    return {"AWS_EC2_METADATA_SERVICE_ENDPOINT": endpoint,
            "AWS_METADATA_SERVICE_TIMEOUT": "1", "AWS_METADATA_SERVICE_NUM_ATTEMPTS": "1",
            "AWS_CONFIG_FILE": str(home / "none"), "AWS_SHARED_CREDENTIALS_FILE":
            str(home / "none"), "HOME": str(home)}


def test_run_once_signs_with_role_keys_from_the_metadata_service(
        secure_s3: SecureS3, db_dsn: str, tmp_path: Path) -> None:
    """No keys in the configuration or the environment: the run-once process asks the
    metadata service (IMDSv2: PUT a session token, then GETs carrying it) for the role's
    keys, and the HEAD signed with them finds the recording SeaweedFS would not show an
    unsigned request; no key reaches its output."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        rec = insert_recording(conn, session_id=insert_call_session(conn))
    trio.run(put_recordings, secure_s3.server, SECURE_BUCKET, [rec.id])
    unsigned = httpx.head(f"{secure_s3.http_url}/{SECURE_BUCKET}/{PREFIX}{rec.id}")
    assert unsigned.status_code == 403  # only a signed HEAD can find it
    role = secure_s3.assume_role("run-once")
    config = tmp_path / "c.toml"
    config.write_text(tomli_w.dumps({
        "postgres": {"dsn": db_dsn},
        "s3": {"endpoint_url": secure_s3.http_url, "bucket": SECURE_BUCKET,
               "region": secure_s3.server.credentials.region},
        "jobs": {"recording_finalize": {"finalize_sla_timeout": "30m"}},
        "logging": {"level": "info"},
    }))
    with serve_imds(role.access_key, role.secret_key, role.token) as imds:
        env = {"PATH": os.environ.get("PATH", ""), **imds_environment(imds.endpoint, tmp_path)}
        proc = subprocess.run([sys.executable, "-m", "supervision.app", "run-once", "--job",
                               "recording-finalize", "-c", str(config)], capture_output=True,
                              text=True, cwd=ROOT, check=False, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    counts = json.loads(proc.stdout)
    assert (counts["reconciled"], counts["transient"]) == (1, 0), counts
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        assert recording(conn, rec.id)["status"] == "Available"
    assert ("PUT", "/latest/api/token", None) in imds.seen
    reads = [(path, token) for method, path, token in imds.seen if method == "GET"]
    assert (CREDS_PATH + ROLE, SESSION_TOKEN) in reads
    assert {token for _, token in reads} == {SESSION_TOKEN}  # every read is IMDSv2
    for secret in (role.secret_key, role.token):
        assert secret not in proc.stdout + proc.stderr


async def test_keys_rotated_at_the_metadata_service_reach_the_running_worker(
        secure_s3: SecureS3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Role keys from the metadata service through botocore's chain; once they are within
    botocore's refresh window (their clock moved 50 minutes on), every refresh tick reads
    the service again: when it rotates to keys SeaweedFS refuses, the worker's HEADs stop
    finding the object; when it rotates to new valid keys, they find it again — one worker
    process throughout."""
    for name in CHAIN_ENV:
        monkeypatch.delenv(name, raising=False)
    first = secure_s3.assume_role("rotation-1")
    ahead = [timedelta(0)]

    def chain_with_a_movable_clock(cfg: S3Config) -> Any:
        creds = resolve_chain(cfg)
        assert isinstance(creds, botocore.credentials.RefreshableCredentials)
        # botocore reads the keys' remaining life through this (its default: the wall
        # clock); the metadata service's answers are left as they are
        creds._time_fetcher = lambda: datetime.now(UTC) + ahead[0]
        return creds

    with serve_imds(first.access_key, first.secret_key, first.token) as imds:
        for name, value in imds_environment(imds.endpoint, tmp_path).items():
            monkeypatch.setenv(name, value)
        cfg = S3Config(endpoint_url=secure_s3.http_url, bucket=SECURE_BUCKET, timeout=5.0,
                       region=secure_s3.server.credentials.region)
        source = CredentialSource(cfg, resolver=chain_with_a_movable_clock)
        async with open_object_store(cfg, credentials=source, refresh_interval=0.1) as store:

            async def until(found: bool) -> None:
                with trio.fail_after(30):
                    outcome = await store.head_recording(PRESENT[0])
                    while isinstance(outcome, Found) != found:
                        await trio.sleep(0.1)
                        outcome = await store.head_recording(PRESENT[0])

            await until(found=True)
            ticks, five_ticks = 0, trio.Event()
            refresh = store.refresh_credentials

            async def counted() -> bool:
                nonlocal ticks
                ticks += 1
                if ticks == 5:
                    five_ticks.set()
                return await refresh()

            store.refresh_credentials = counted  # type: ignore[method-assign]
            asked = imds.requests
            with trio.fail_after(30):
                await five_ticks.wait()
            assert imds.requests == asked  # five ticks with an hour left: not asked
            ahead[0] = timedelta(minutes=50)
            imds.access_key, imds.secret_key = "ASIAREVOKED", "revoked-secret"
            await until(found=False)
            second = secure_s3.assume_role("rotation-2")
            imds.access_key, imds.secret_key, imds.token = (
                second.access_key, second.secret_key, second.token)
            await until(found=True)
            assert store.starts == 1
            assert store.credential_updates >= 2
