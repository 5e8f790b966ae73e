"""Object storage (SPEC §3): HEAD a recording's binary and classify the answer.

>>> async with open_object_store(cfg.s3) as store:
...     outcome = await store.head_recording(recording_id)   # Found | Missing | Transient | ...

Requests are SigV4-signed by httpx-auth's ``AWS4Auth``; credentials come from the
configuration. Nothing here logs a URL or a credential: outcomes carry a class and a code
(``"http_503"``, ``"ReadTimeout"``) that is safe to store in ``last_error``.

Outcome classes: 200 → :class:`Found` (metadata adopted), 404 → :class:`Missing`; 5xx, 429,
timeouts and connection errors → :class:`Transient`; 403, or any other 4xx → :class:`Fault`
(configuration: not retried, no attempt consumed); an object whose Content-Type or
duration is missing or unknown → :class:`Poison` (quarantined at once).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TypeAlias
from urllib.parse import quote

import attrs
import httpx
import httpx_auth

from supervision.config import S3Config

FORMATS = {
    "audio/webm": "Webm", "video/webm": "Webm",
    "audio/mp4": "Mp4", "video/mp4": "Mp4",
    "audio/ogg": "Ogg",
}
DURATION_HEADER = "x-amz-meta-duration-seconds"
CANARY = "__safetynet_probe__"  # a key no recording can have (recording ids are UUIDs)


@attrs.frozen
class Found:
    file_id: str
    size_bytes: int
    format: str
    duration_seconds: int


@attrs.frozen
class Missing:
    pass


@attrs.frozen
class Transient:
    error: str


@attrs.frozen
class Fault:
    error: str


@attrs.frozen
class Poison:
    error: str


HeadOutcome: TypeAlias = Found | Missing | Transient | Fault | Poison


def classify_object(key: str, response: httpx.Response) -> HeadOutcome:
    """Turn a HEAD-object response into an outcome (pure; unit-tested)."""
    status = response.status_code
    if status == 200:
        return _metadata(key, response.headers)
    if status == 404:
        return Missing()
    return _classify_error(status, response.headers)


def classify_bucket(response: httpx.Response) -> Found | Transient | Fault:
    """HEAD bucket: 200 is healthy; 404 (no such bucket) and 403 are configuration faults."""
    if response.status_code == 200:
        return Found("", 0, "", 0)
    if response.status_code == 404:
        return Fault("bucket_missing")
    outcome = _classify_error(response.status_code, response.headers)
    assert not isinstance(outcome, Missing | Found | Poison)
    return outcome


def _classify_error(status: int, headers: httpx.Headers) -> HeadOutcome:
    code = headers.get("x-amz-error-code", "")
    label = f"http_{status}" + (f"_{code}" if code else "")
    if status >= 500 or status == 429 or code == "SlowDown":
        return Transient(label)
    if status == 403:
        return Fault(f"access_denied_{label}")
    return Fault(label)


def _metadata(key: str, headers: httpx.Headers) -> HeadOutcome:
    content_type = headers.get("content-type", "").split(";")[0].strip().lower()
    if not content_type:
        return Poison("content_type_missing")
    if content_type not in FORMATS:
        return Poison(f"content_type_unknown:{content_type[:64]}")
    raw_duration = headers.get(DURATION_HEADER)
    if raw_duration is None:
        return Poison("duration_missing")
    if not raw_duration.strip().isdigit():
        return Poison(f"duration_invalid:{raw_duration[:32]}")
    length = headers.get("content-length", "")
    if not length.isdigit():
        return Poison("content_length_missing")
    return Found(key, int(length), FORMATS[content_type], int(raw_duration.strip()))


class ObjectStore:
    """Signed HEAD requests against the CALL_RECORDINGS bucket."""

    def __init__(self, cfg: S3Config, client: httpx.AsyncClient) -> None:
        self._cfg = cfg
        self._client = client
        self._base = cfg.endpoint_url.rstrip("/")

    def key_for(self, recording_id: str) -> str:
        return f"{self._cfg.key_prefix}{recording_id}"

    async def head_bucket(self) -> Found | Transient | Fault:
        try:
            response = await self._client.head(f"{self._base}/{quote(self._cfg.bucket)}")
        except httpx.TransportError as exc:
            return Transient(type(exc).__name__)
        return classify_bucket(response)

    async def head_canary(self) -> Found | Transient | Fault:
        """HEAD a key under the recordings prefix that never exists: 404 (or 200) means the
        object path works; 5xx/429/timeouts mean it does not, even when HEAD bucket is
        fine (a SlowDown storm, volume servers down)."""
        url = f"{self._base}/{quote(self._cfg.bucket)}/{quote(self.key_for(CANARY))}"
        try:
            response = await self._client.head(url)
        except httpx.TransportError as exc:
            return Transient(type(exc).__name__)
        if response.status_code in (200, 404):
            return Found("", 0, "", 0)
        outcome = _classify_error(response.status_code, response.headers)
        assert isinstance(outcome, Transient | Fault)
        return outcome

    async def probe(self) -> Found | Transient | Fault:
        """The cycle's health check: the bucket, then the object path."""
        bucket = await self.head_bucket()
        if not isinstance(bucket, Found):
            return bucket
        return await self.head_canary()

    async def head_recording(self, recording_id: str) -> HeadOutcome:
        key = self.key_for(recording_id)
        url = f"{self._base}/{quote(self._cfg.bucket)}/{quote(key)}"
        try:
            response = await self._client.head(url)
        except httpx.TransportError as exc:
            return Transient(type(exc).__name__)
        return classify_object(key, response)


@asynccontextmanager
async def open_object_store(cfg: S3Config) -> AsyncIterator[ObjectStore]:
    """An :class:`ObjectStore` whose connections are closed on every exit path."""
    auth: httpx.Auth | None = None
    if cfg.access_key_id and cfg.secret_access_key:
        auth = httpx_auth.AWS4Auth(
            access_id=cfg.access_key_id.reveal(), secret_key=cfg.secret_access_key.reveal(),
            region=cfg.region, service="s3",
        )
    # Without credentials requests go unsigned; a store that requires them answers 403,
    # which is a configuration fault (readiness 503), not a crash.
    limits = httpx.Limits(max_connections=cfg.concurrency,
                          max_keepalive_connections=cfg.concurrency)
    async with httpx.AsyncClient(auth=auth, timeout=cfg.timeout, limits=limits,
                                 follow_redirects=False) as client:
        yield ObjectStore(cfg, client)
