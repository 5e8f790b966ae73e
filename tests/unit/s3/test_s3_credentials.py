"""The S3 credentials come from the config's keys, else botocore's chain, in its order."""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import botocore.credentials
import botocore.exceptions
import pytest

from actors.s3.credentials import (
    BACKOFF_BASE,
    CredentialSource,
    CredentialsUnavailable,
    classify_failure,
)
from actors.s3.objectstore import Fault, Transient
from actors.s3.wire import Credentials
from supervision.config import S3Config
from supervision.secrets import Secret


@pytest.fixture
def aws_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """No AWS_* variable of the machine, shared files in *tmp_path*, no metadata service."""
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    yield tmp_path


def keys(key_id: str, secret: str, token: str = "") -> Credentials:
    return Credentials(Secret(key_id), Secret(secret), Secret(token))


def test_static_keys_from_the_config_win_over_the_environment(
        aws_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """s3.access_key_id/secret_access_key are used as they are, AWS_* variables ignored."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "ENVKEY")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "envsecret")
    cfg = S3Config(access_key_id=Secret("CFGKEY"), secret_access_key=Secret("cfgsecret"))
    assert CredentialSource(cfg).current() == keys("CFGKEY", "cfgsecret")


def test_environment_keys_carry_the_session_token(
        aws_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With no static keys, AWS_ACCESS_KEY_ID/SECRET/SESSION_TOKEN are picked up whole."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "ASIAENV")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "envsecret")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "envtoken")
    (aws_home / "credentials").write_text(
        "[default]\naws_access_key_id = FILEKEY\naws_secret_access_key = filesecret\n")
    assert CredentialSource(S3Config()).current() == keys("ASIAENV", "envsecret", "envtoken")


def test_a_named_profile_reads_the_shared_credentials_file(
        aws_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """s3.profile picks a section of the shared credentials file, and (as in botocore)
    naming a profile skips the environment keys."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "ENVKEY")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "envsecret")
    (aws_home / "credentials").write_text(
        "[default]\naws_access_key_id = DEFKEY\naws_secret_access_key = defsecret\n"
        "[recordings]\naws_access_key_id = RECKEY\naws_secret_access_key = recsecret\n"
        "aws_session_token = rectoken\n")
    source = CredentialSource(S3Config(profile="recordings"))
    assert source.current() == keys("RECKEY", "recsecret", "rectoken")
    assert not source.refreshable


def test_no_credentials_anywhere_means_unsigned_requests(aws_home: Path) -> None:
    """An empty chain gives None: the worker sends unsigned requests."""
    assert CredentialSource(S3Config()).current() is None


def test_an_unknown_profile_is_a_configuration_fault(aws_home: Path) -> None:
    """A profile the shared files do not have is a Fault: retrying will not help."""
    with pytest.raises(CredentialsUnavailable) as info:
        CredentialSource(S3Config(profile="nope")).current()
    assert info.value.outcome == Fault("credentials_invalid:ProfileNotFound")


def test_web_identity_settings_reach_botocores_provider(
        aws_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """AWS_WEB_IDENTITY_TOKEN_FILE + AWS_ROLE_ARN give refreshable credentials (fetched
    from STS on first use: here STS is unreachable, which is not a configuration fault)."""
    token = aws_home / "token"
    token.write_text("eyJhbGciOiJub25lIn0.e30.")
    monkeypatch.setenv("AWS_WEB_IDENTITY_TOKEN_FILE", str(token))
    monkeypatch.setenv("AWS_ROLE_ARN", "arn:aws:iam::123456789012:role/recordings")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL_STS", "http://127.0.0.1:9")  # nothing listens
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    source = CredentialSource(S3Config())
    with pytest.raises(CredentialsUnavailable) as info:
        source.current()
    assert isinstance(info.value.outcome, Transient)
    assert info.value.outcome.error.startswith("credentials_unavailable:")
    assert source.refreshable


@pytest.mark.parametrize(("status", "expected"), [
    (403, Fault("credentials_refused:AccessDenied")),
    (503, Transient("credentials_unavailable:AccessDenied")),
])
def test_sts_refusals_are_faults_and_outages_transient(status: int, expected: object) -> None:
    """A 4xx from STS (the role does not trust the token) is a configuration fault; a 5xx
    may pass."""
    exc = botocore.exceptions.ClientError(
        {"Error": {"Code": "AccessDenied", "Message": "no"},
         "ResponseMetadata": {"HTTPStatusCode": status}}, "AssumeRoleWithWebIdentity")
    assert classify_failure(exc) == expected


def _metadata(expires_in: timedelta, key: str = "ASIAREFRESH") -> dict[str, str]:
    return {"access_key": key, "secret_key": "refreshed-secret", "token": "tok",
            "expiry_time": (datetime.now(UTC) + expires_in).isoformat()}


def test_a_refresh_still_expired_is_transient_with_back_off_then_recovers(
        aws_home: Path) -> None:
    """botocore's plain RuntimeError (a refresh whose keys are still expired) becomes a
    Transient; the source is not asked again within the back-off, and once the refresh
    gives fresh keys, they are returned."""
    now = [0.0]
    refreshes: list[timedelta] = []
    answer = [timedelta(minutes=-1)]

    def refresh() -> dict[str, str]:
        refreshes.append(answer[0])
        return _metadata(answer[0])

    creds = botocore.credentials.RefreshableCredentials.create_from_metadata(
        _metadata(timedelta(minutes=5)), refresh_using=refresh, method="test")
    source = CredentialSource(S3Config(), resolver=lambda _cfg: creds, clock=lambda: now[0])
    with pytest.raises(CredentialsUnavailable) as info:
        source.current()
    assert info.value.outcome == Transient("credentials_unavailable:expired_after_refresh")
    asked = len(refreshes)
    with pytest.raises(CredentialsUnavailable):
        source.current()  # within the back-off: not asked again
    assert len(refreshes) == asked
    answer[0] = timedelta(hours=1)
    now[0] += BACKOFF_BASE + 0.01
    assert source.current() == keys("ASIAREFRESH", "refreshed-secret", "tok")


def test_nothing_found_with_the_metadata_service_on_is_transient_and_asked_again(
        aws_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An empty chain while IMDS is enabled is what an IMDS outage looks like: Transient,
    not 'unsigned for good'; after the back-off the chain is asked again."""
    monkeypatch.delenv("AWS_EC2_METADATA_DISABLED")
    now = [0.0]
    found: list[Any] = [None]
    asked = []

    def resolver(_cfg: S3Config) -> Any:
        asked.append(1)
        return found[0]

    source = CredentialSource(S3Config(), resolver=resolver, clock=lambda: now[0])
    for _ in range(2):
        with pytest.raises(CredentialsUnavailable) as info:
            source.current()
        assert info.value.outcome == Transient("credentials_unavailable:none_found")
    assert len(asked) == 1
    found[0] = botocore.credentials.Credentials("AKIALATER", "later-secret")
    now[0] += BACKOFF_BASE + 0.01
    assert source.current() == keys("AKIALATER", "later-secret")


async def test_a_refresh_raising_runtime_error_leaves_the_store_running(
        aws_home: Path) -> None:
    """refresh_credentials with a source whose refresh is still expired logs and returns
    False; the store and its worker go on answering."""
    from actors.s3.objectstore import Missing
    from actors.s3.process import open_object_store
    from tests.unit.s3.test_s3_process import CFG, FAKE

    answer = [timedelta(hours=1)]
    creds = botocore.credentials.RefreshableCredentials.create_from_metadata(
        _metadata(timedelta(hours=1)), refresh_using=lambda: _metadata(answer[0]),
        method="test")
    source = CredentialSource(CFG, resolver=lambda _cfg: creds)
    async with open_object_store(CFG, command=FAKE, credentials=source,
                                 refresh_interval=3600) as store:
        assert await store.head_recording("r1") == Missing()
        answer[0] = timedelta(minutes=-1)
        creds._expiry_time = datetime.now(UTC) + timedelta(minutes=1)  # mandatory refresh
        assert await store.refresh_credentials() is False
        assert await store.head_recording("r2") == Missing()
