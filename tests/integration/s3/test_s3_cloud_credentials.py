"""S3 as clouds run it (issue 16), against a real SeaweedFS: session credentials from its
STS (signed ``x-amz-security-token``), web identity through botocore's chain, credentials
rotated under a running drain, virtual-hosted buckets, TLS from a private CA — and a
certificate nobody trusts as a configuration fault."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import botocore.credentials
import psycopg
import pytest
import trio
import trio.lowlevel

from actors.s3.credentials import CredentialSource
from actors.s3.objectstore import Fault, Found, Transient
from actors.s3.process import open_object_store
from supervision.app.settings import Config
from supervision.config import S3Config
from supervision.secrets import Secret
from supervision.tree.health import HEALTH
from tests.conftest import make_config
from tests.faults import open_fault_proxy, put_recordings
from tests.integration.finalize.test_recording_finalize import counts_of, run_cycle
from tests.messenger import attempt, insert_call_session, insert_recording
from tests.secure_s3 import ROLE_ARN, SECURE_BUCKET, SecureS3, open_secure_s3

PRESENT = [str(uuid.uuid4()) for _ in range(40)]


@pytest.fixture(scope="module")
def secure_s3(stack_dir: Path) -> Iterator[SecureS3]:
    with open_secure_s3(stack_dir / f"secure-s3-{uuid.uuid4().hex[:6]}") as s3:
        trio.run(put_recordings, s3.server, SECURE_BUCKET, PRESENT)
        yield s3


def s3_config(endpoint_url: str, **overrides: Any) -> S3Config:
    return S3Config(endpoint_url=endpoint_url, bucket=SECURE_BUCKET, timeout=5.0,
                    **overrides)


def static_keys(s3: SecureS3) -> dict[str, Secret]:
    c = s3.server.credentials
    return {"access_key_id": Secret(c.access_key_id),
            "secret_access_key": Secret(c.secret_access_key)}


def fixed(creds: botocore.credentials.Credentials) -> CredentialSource:
    """A source that hands out *creds* as botocore gave them."""
    return CredentialSource(S3Config(), resolver=lambda _cfg: creds)


async def test_session_credentials_send_a_signed_security_token_seaweedfs_requires(
        secure_s3: SecureS3) -> None:
    """Keys from SeaweedFS's STS: the worker sends the session token as
    x-amz-security-token inside the SigV4 signature, and SeaweedFS answers 200; the same
    keys without their token are refused (403 → a configuration fault)."""
    creds = secure_s3.assume_role()
    assert creds.token
    url = urlsplit(secure_s3.http_url)
    assert url.hostname is not None and url.port is not None
    async with open_fault_proxy(url.hostname, url.port, http=True) as proxy:
        cfg = s3_config(f"http://127.0.0.1:{proxy.port}")
        async with open_object_store(cfg, credentials=fixed(creds)) as store:
            assert isinstance(await store.head_recording(PRESENT[0]), Found)
        (request,) = [r for r in proxy.seen if r.method == "HEAD"]
        assert request.headers["x-amz-security-token"] == creds.token
        signed = re.search(r"SignedHeaders=([^,]+)", request.headers["authorization"])
        assert signed is not None
        assert "x-amz-security-token" in signed.group(1).split(";")
        assert f"Credential={creds.access_key}/" in request.headers["authorization"]

        tokenless = botocore.credentials.Credentials(creds.access_key, creds.secret_key)
        async with open_object_store(cfg, credentials=fixed(tokenless)) as store:
            outcome = await store.head_recording(PRESENT[0])
    assert isinstance(outcome, Fault) and outcome.error.startswith("access_denied_http_403")


async def test_web_identity_from_the_environment_reaches_seaweedfs_through_sts(
        secure_s3: SecureS3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No keys in the config: AWS_WEB_IDENTITY_TOKEN_FILE + AWS_ROLE_ARN (as on
    Kubernetes) make botocore's chain call AssumeRoleWithWebIdentity, and the worker's
    HEADs carry the session credentials it returned."""
    token_file = tmp_path / "token"
    token_file.write_text(secure_s3.oidc.token("safetynet-pod"))
    for name, value in {
        "AWS_WEB_IDENTITY_TOKEN_FILE": str(token_file), "AWS_ROLE_ARN": ROLE_ARN,
        "AWS_ROLE_SESSION_NAME": "safetynet", "AWS_REGION": "us-east-1",
        "AWS_ENDPOINT_URL_STS": secure_s3.http_url,
        "AWS_CONFIG_FILE": str(tmp_path / "none"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
        "AWS_EC2_METADATA_DISABLED": "true",
    }.items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                 "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    source = CredentialSource(s3_config(secure_s3.http_url))
    async with open_object_store(s3_config(secure_s3.http_url), credentials=source) as store:
        assert isinstance(await store.head_recording(PRESENT[1]), Found)
        assert isinstance(await store.head_bucket(), Found)
    assert source.refreshable
    assert source.current() is not None and source.current().session_token  # type: ignore[union-attr]


async def test_credentials_rotated_mid_drain_fail_no_head(secure_s3: SecureS3) -> None:
    """Temporary credentials renewed again and again while 16 tasks HEAD without pause:
    each renewal is a new key id, secret and token from STS, handed to the same worker
    over its pipe. Every HEAD is Found (no request signed with a mix of two generations,
    none unsigned) and the worker was never restarted."""
    issued: list[str] = []

    def renew() -> dict[str, str]:
        creds = secure_s3.assume_role(f"rotation-{len(issued)}")
        issued.append(creds.access_key)
        # claim a 5-minute life: inside botocore's mandatory window, so every ask renews
        return {"access_key": creds.access_key, "secret_key": creds.secret_key,
                "token": creds.token,
                "expiry_time": (datetime.now(UTC) + timedelta(minutes=5)).isoformat()}

    refreshable = botocore.credentials.RefreshableCredentials.create_from_metadata(
        renew(), renew, "test-sts")
    rotations_wanted, done = 6, trio.Event()
    outcomes: list[object] = []
    url = urlsplit(secure_s3.http_url)
    assert url.hostname is not None and url.port is not None
    async with open_fault_proxy(url.hostname, url.port, http=True) as proxy, \
            open_object_store(s3_config(f"http://127.0.0.1:{proxy.port}"),
                              credentials=fixed(refreshable)) as store:
        async def drain(offset: int) -> None:
            n = offset
            while not done.is_set():
                outcomes.append(await store.head_recording(PRESENT[n % len(PRESENT)]))
                n += 1

        async def rotate() -> None:
            answered = 0
            while store.credential_updates < rotations_wanted:
                while len(outcomes) < answered + 20:  # some HEADs between two rotations
                    await trio.lowlevel.checkpoint()
                answered = len(outcomes)
                await store.refresh_credentials()
            # the drain ends once the last rotation's key has signed HEADs of its own
            while len(outcomes) < answered + 40 or not signed_by(issued[-1]):
                await trio.lowlevel.checkpoint()
            done.set()

        def signed_by(key: str) -> bool:
            return any(f"Credential={key}/" in r.headers["authorization"] for r in proxy.seen)

        async with trio.open_nursery() as nursery:
            for offset in range(16):
                nursery.start_soon(drain, offset)
            nursery.start_soon(rotate)
        assert store.starts == 1
    assert store.credential_updates == rotations_wanted
    assert len(outcomes) > 20 * rotations_wanted
    assert [o for o in outcomes if not isinstance(o, Found)] == []
    signed_with = {m.group(1) for r in proxy.seen
                   if (m := re.search(r"Credential=([^/]+)/", r.headers["authorization"]))}
    # the first keys and every rotation's, as they were handed to the worker
    assert len(signed_with) == rotations_wanted + 1 and signed_with <= set(issued)


@pytest.mark.parametrize("tls", [False, True], ids=["http", "https"])
async def test_virtual_hosted_style_puts_the_bucket_in_the_host_name(
        secure_s3: SecureS3, tls: bool) -> None:
    """addressing_style = virtual: HEADs go to <bucket>.localhost (SeaweedFS with
    -s3.domainName=localhost) and find the objects, over plain HTTP and TLS alike."""
    endpoint = secure_s3.https_url if tls else f"http://localhost:{secure_s3.server.ports['s3.port']}"
    cfg = s3_config(endpoint, addressing_style="virtual",
                    ca_file=str(secure_s3.ca_file) if tls else "", **static_keys(secure_s3))
    async with open_object_store(cfg) as store:
        assert isinstance(await store.head_bucket(), Found)
        assert isinstance(await store.head_recording(PRESENT[2]), Found)
        assert isinstance(await store.head_canary(), Found)  # 404: the object path answers


async def test_a_private_ca_file_lets_the_worker_verify_the_endpoint(
        secure_s3: SecureS3) -> None:
    """s3.ca_file = the throwaway CA: signed HEADs over TLS find the objects."""
    cfg = s3_config(secure_s3.https_url, ca_file=str(secure_s3.ca_file),
                    **static_keys(secure_s3))
    async with open_object_store(cfg) as store:
        assert isinstance(await store.probe(), Found)
        assert isinstance(await store.head_recording(PRESENT[3]), Found)


async def test_a_certificate_the_ca_bundle_does_not_trust_is_a_fault(
        secure_s3: SecureS3) -> None:
    """Without s3.ca_file (certifi's public CAs) the private certificate is refused, and
    the HEAD answers a Fault — configuration, never a Transient to retry or a verdict."""
    cfg = s3_config(secure_s3.https_url, **static_keys(secure_s3))
    async with open_object_store(cfg) as store:
        assert await store.head_bucket() == Fault("tls_certificate_untrusted")
        assert await store.head_recording(PRESENT[4]) == Fault("tls_certificate_untrusted")


@pytest.fixture
def clean_health() -> Iterator[None]:
    yield
    HEALTH.clear_fault("s3")


async def test_an_untrusted_certificate_stops_the_cycle_as_a_configuration_fault(
        db_dsn: str, secure_s3: SecureS3, clean_health: None) -> None:
    """A due recording whose binary exists, and a daemon that does not trust the
    endpoint's certificate: nothing is claimed, no attempt spent, readiness names the
    fault; with s3.ca_file set the same row is reconciled."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        rec = insert_recording(conn, session_id=insert_call_session(conn, ended_ago=3600))
        await put_recordings(secure_s3.server, SECURE_BUCKET, [rec.id])

        def config(**s3: Any) -> Config:
            c = secure_s3.server.credentials
            return make_config(db_dsn, s3={
                "endpoint_url": secure_s3.https_url, "bucket": SECURE_BUCKET,
                "access_key_id": c.access_key_id, "secret_access_key": c.secret_access_key,
                "timeout": "5s", **s3})

        counts = await run_cycle(config())
        assert counts_of(counts) == {}
        assert attempt(conn, rec.id)["attempts"] == 0
        assert HEALTH.reason() == "configuration fault in s3: tls_certificate_untrusted"

        healed = await run_cycle(config(ca_file=str(secure_s3.ca_file)))
        assert counts_of(healed) == {"reconciled": 1}
        assert HEALTH.reason() is None


async def test_an_imds_outage_at_the_first_request_heals_by_itself(
        secure_s3: SecureS3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No keys in the config, the metadata service (a loopback stand-in) down at the first
    HEAD: the HEAD is not sent (Transient, no unsigned request); once the service is back,
    a later HEAD within the back-off is signed with its keys and finds the object, with
    no restart of the store."""
    from tests.imds_stub import serve_imds

    creds = secure_s3.assume_role()
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                 "AWS_PROFILE", "AWS_EC2_METADATA_DISABLED", "AWS_WEB_IDENTITY_TOKEN_FILE",
                 "AWS_ROLE_ARN", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                 "AWS_CONTAINER_CREDENTIALS_FULL_URI"):
        monkeypatch.delenv(name, raising=False)
    with serve_imds(creds.access_key, creds.secret_key, creds.token) as imds:
        for name, value in {"AWS_EC2_METADATA_SERVICE_ENDPOINT": imds.endpoint,
                            "AWS_METADATA_SERVICE_TIMEOUT": "1",
                            "AWS_METADATA_SERVICE_NUM_ATTEMPTS": "1",
                            "AWS_CONFIG_FILE": str(tmp_path / "none"),
                            "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none")}.items():
            monkeypatch.setenv(name, value)
        imds.up = False
        cfg = s3_config(secure_s3.http_url)
        source = CredentialSource(cfg)
        async with open_object_store(cfg, credentials=source, respawn_interval=0.2) as store:
            outcome = await store.head_recording(PRESENT[2])
            assert isinstance(outcome, Transient), outcome
            assert imds.requests > 0 and store.starts == 0  # asked, nothing sent unsigned
            imds.up = True
            with trio.fail_after(30):
                while not isinstance(outcome, Found):
                    await trio.sleep(0.2)
                    outcome = await store.head_recording(PRESENT[2])
            assert store.starts == 1
        assert source.refreshable
