"""Object storage (SPEC §3): the outcomes of a HEAD and how an answer is classified.

>>> classify_object("call-recordings/r1", 200, {"content-type": "audio/ogg",
...     "content-length": "64", "x-amz-meta-duration-seconds": "42"})
Found(file_id='call-recordings/r1', size_bytes=64, format='Ogg', duration_seconds=42)

The requests themselves are made by the S3 worker process (``actors.s3.worker``,
libcurl) behind ``actors.s3.process.open_object_store``; :class:`ObjectStore` is
the interface the job sees. Nothing here logs a URL or a credential: outcomes carry a
class and a code (``"http_503"``, ``"Timeout"``) that is safe to store in ``last_error``.

Outcome classes: 200 → :class:`Found` (metadata adopted), 404 → :class:`Missing` (but a 404
whose error code says ``NoSuchBucket`` is a :class:`Fault`); 5xx, 429,
timeouts and connection errors → :class:`Transient`; 403, or any other 4xx → :class:`Fault`
(configuration: not retried, no attempt consumed); an object whose Content-Type or
duration is missing or unknown → :class:`Poison` (quarantined at once).

Headers are passed as a mapping with lower-case names.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from typing import Protocol, TypeAlias

import attrs

FORMATS = {
    "audio/webm": "Webm", "video/webm": "Webm",
    "audio/mp4": "Mp4", "video/mp4": "Mp4",
    "audio/ogg": "Ogg",
}
DURATION_HEADER = "x-amz-meta-duration-seconds"
CANARY = "__safetynet_probe__"  # a key no recording can have (recording ids are UUIDs)
LIST_MAX_KEYS = 20  # keys one evidence listing asks for (ListObjectsV2 max-keys)
MAX_LIST_BODY = 256 * 1024  # bytes of a listing read at most (20 keys: ~6 KB)


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
HEALTHY = Found("", 0, "", 0)  # what a probe answers when the store works


class ObjectStore(Protocol):
    """What the recording-finalize job needs from object storage."""

    async def head_bucket(self) -> Found | Transient | Fault: ...

    async def head_canary(self) -> Found | Transient | Fault: ...

    async def probe(self) -> Found | Transient | Fault: ...

    async def head_recording(self, recording_id: str) -> HeadOutcome: ...

    async def list_recordings(self) -> Found | Missing | Transient | Fault: ...


def classify_object(key: str, status: int, headers: Mapping[str, str]) -> HeadOutcome:
    """HEAD object: 200 → metadata (or Poison), 404 → Missing, else an error class."""
    if status == 200:
        return _metadata(key, headers)
    if status == 404:
        return Fault("bucket_missing") if _no_such_bucket(headers) else Missing()
    return _classify_error(status, headers)


def classify_bucket(status: int, headers: Mapping[str, str]) -> Found | Transient | Fault:
    """HEAD bucket: 200 is healthy; 404 (no such bucket) and 403 are configuration faults."""
    if status == 200:
        return HEALTHY
    if status == 404:
        return Fault("bucket_missing")
    return _classify_error(status, headers)


def classify_canary(status: int, headers: Mapping[str, str]) -> Found | Transient | Fault:
    """HEAD of a key under the recordings prefix that never exists: 404 means the object
    path answers; 5xx/429/timeouts mean it does not, even when HEAD bucket is fine (a
    SlowDown storm, volume servers down). A 200 there is a configuration fault: the
    endpoint answers "found" for anything (a catch-all proxy, a website endpoint), so its
    HEADs cannot tell present from missing. So is a 404 that says ``NoSuchBucket``."""
    if status == 404:
        return Fault("bucket_missing") if _no_such_bucket(headers) else HEALTHY
    if status == 200:
        return Fault("canary_key_exists")
    return _classify_error(status, headers)


def classify_listing(prefix: str, status: int, headers: Mapping[str, str],
                     body: bytes) -> Found | Missing | Transient | Fault:
    """ListObjectsV2 under the recordings prefix (``delimiter=/``, :data:`LIST_MAX_KEYS`
    keys): :class:`Found` (its ``file_id`` the first key) when a key directly under the
    prefix is named like a recording (``{prefix}{uuid}``) — proof that binaries live
    where the HEADs look; :class:`Missing` when none is; 403 and other 4xx a
    :class:`Fault` (``AccessDenied``: the grant is missing, the caller falls back to its
    other evidence); 5xx/429 :class:`Transient`; a body that is not a listing Transient
    ``list_unreadable``."""
    if status != 200:
        if status == 404:
            return Fault("bucket_missing")
        return _classify_error(status, headers)
    try:
        root = ET.fromstring(body)
    except ET.ParseError:
        return Transient("list_unreadable")
    if _local(root.tag) != "ListBucketResult":
        return Transient("list_unreadable")
    for contents in root:
        if _local(contents.tag) != "Contents":
            continue
        for child in contents:
            if _local(child.tag) == "Key" and child.text and _recording_key(prefix, child.text):
                return Found(child.text, 0, "", 0)
    return Missing()


def _local(tag: str) -> str:
    """An element's name without its namespace (``{http://s3...}Key`` → ``Key``)."""
    return tag.rpartition("}")[2]


_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")


def _recording_key(prefix: str, key: str) -> bool:
    return key.startswith(prefix) and _UUID.fullmatch(key[len(prefix):]) is not None


def _error_code(headers: Mapping[str, str]) -> str:
    """The S3 error code of a bodiless (HEAD) answer, where the store sends one."""
    return headers.get("x-amz-error-code") or headers.get("x-minio-error-code") or ""


def _no_such_bucket(headers: Mapping[str, str]) -> bool:
    return _error_code(headers) == "NoSuchBucket"


def _classify_error(status: int, headers: Mapping[str, str]) -> Transient | Fault:
    code = _error_code(headers)
    label = f"http_{status}" + (f"_{code}" if code else "")
    if status >= 500 or status == 429 or code == "SlowDown":
        return Transient(label)
    if status == 403:
        return Fault(f"access_denied_{label}")
    return Fault(label)


def _metadata(key: str, headers: Mapping[str, str]) -> HeadOutcome:
    content_type = headers.get("content-type", "").split(";")[0].strip().lower()
    if not content_type:
        return Poison("content_type_missing")
    if content_type not in FORMATS:
        return Poison(f"content_type_unknown:{printable(content_type[:64])}")
    raw_duration = headers.get(DURATION_HEADER)
    if raw_duration is None:
        return Poison("duration_missing")
    duration = _whole_number(raw_duration, MAX_DURATION)
    if duration is None:
        return Poison(f"duration_invalid:{printable(raw_duration.strip()[:32])}")
    length = _whole_number(headers.get("content-length", ""), MAX_SIZE)
    if length is None:
        return Poison("content_length_missing")
    return Found(key, length, FORMATS[content_type], duration)


MAX_DURATION = 2**31 - 1  # call_recordings.duration_seconds is an int
MAX_SIZE = 2**63 - 1  # size_bytes is a bigint
_ASCII_DIGITS = re.compile(r"[0-9]{1,19}")


def _whole_number(text: str, maximum: int) -> int | None:
    """*text* as a non-negative integer up to *maximum*, else None. ASCII digits only:
    ``str.isdigit`` accepts ``'²'``, which ``int`` refuses, and ``int`` raises past 4,300
    digits; neither may reach ``int`` unchecked."""
    match = _ASCII_DIGITS.fullmatch(text.strip())
    if match is None:
        return None
    value = int(match.group())
    return value if value <= maximum else None


def printable(text: str) -> str:
    """*text* fit for ``last_error`` and a log line: printable ASCII, the rest as ``?``."""
    if text.isascii() and text.isprintable():  # the usual case: " " to "~" only
        return text
    return "".join(c if " " <= c <= "~" else "?" for c in text)
