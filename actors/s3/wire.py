"""The line protocol between the daemon and its S3 worker process (``s3_worker``).

>>> decode_outcome(encode_outcome(Found("k", 10, "Webm", 3)))
Found(file_id='k', size_bytes=10, format='Webm', duration_seconds=3)

One JSON array per line, UTF-8. The first line the daemon sends is the worker's
configuration (:func:`encode_settings`, credentials included — a pipe, never argv or the
environment). Then requests ``[id, op, recording_id]`` with ``op`` one of
:data:`OPERATIONS`, and answers ``[id, tag, *fields]`` in any order, where the tag names
the outcome class. Pure functions and a line splitter: unit-tested without processes.
"""

from __future__ import annotations

import json
from typing import Any

from actors.s3.objectstore import Fault, Found, HeadOutcome, Missing, Poison, Transient
from supervision.config import S3Config
from supervision.errors import WireError
from supervision.secrets import Secret

OP_OBJECT, OP_BUCKET, OP_CANARY = "object", "bucket", "canary"
OPERATIONS = (OP_OBJECT, OP_BUCKET, OP_CANARY)
_ERROR_TAGS: dict[str, type[Transient | Fault | Poison]] = {
    "transient": Transient, "fault": Fault, "poison": Poison,
}
MAX_LINE = 64 * 1024


def encode_settings(cfg: S3Config) -> bytes:
    fields = {
        "endpoint_url": cfg.endpoint_url, "region": cfg.region, "bucket": cfg.bucket,
        "key_prefix": cfg.key_prefix, "access_key_id": cfg.access_key_id.reveal(),
        "secret_access_key": cfg.secret_access_key.reveal(), "timeout": cfg.timeout,
        "concurrency": cfg.concurrency,
    }
    return _line(fields)


def decode_settings(line: bytes) -> S3Config:
    try:
        fields = json.loads(line)
        return S3Config(
            endpoint_url=str(fields["endpoint_url"]), region=str(fields["region"]),
            bucket=str(fields["bucket"]), key_prefix=str(fields["key_prefix"]),
            access_key_id=Secret(str(fields["access_key_id"])),
            secret_access_key=Secret(str(fields["secret_access_key"])),
            timeout=float(fields["timeout"]), concurrency=int(fields["concurrency"]),
        )
    except (ValueError, TypeError, KeyError) as exc:
        raise WireError(f"bad settings line: {type(exc).__name__}") from None


def encode_request(request_id: int, op: str, recording_id: str) -> bytes:
    return _line([request_id, op, recording_id])


def decode_request(line: bytes) -> tuple[int, str, str]:
    fields = _json_list(line, "request")
    if len(fields) != 3:
        raise WireError("bad request line: unexpected fields")
    request_id, op, recording_id = fields
    if not isinstance(request_id, int) or op not in OPERATIONS \
            or not isinstance(recording_id, str):
        raise WireError("bad request line: unexpected fields")
    return request_id, op, recording_id


def encode_outcome(outcome: HeadOutcome) -> list[Any]:
    if isinstance(outcome, Found):
        return ["found", outcome.file_id, outcome.size_bytes, outcome.format,
                outcome.duration_seconds]
    if isinstance(outcome, Missing):
        return ["missing"]
    return [type(outcome).__name__.lower(), outcome.error]


def decode_outcome(fields: list[Any]) -> HeadOutcome:
    match fields:
        case ["found", str(file_id), int(size), str(fmt), int(duration)]:
            return Found(file_id, size, fmt, duration)
        case ["missing"]:
            return Missing()
        case [str(tag), str(error)] if tag in _ERROR_TAGS:
            return _ERROR_TAGS[tag](error)
    raise WireError(f"bad outcome: {str(fields)[:80]}")


def encode_answer(request_id: int, outcome: HeadOutcome) -> bytes:
    return _line([request_id, *encode_outcome(outcome)])


def decode_answer(line: bytes) -> tuple[int, HeadOutcome]:
    fields = _json_list(line, "answer")
    if not fields or not isinstance(fields[0], int):
        raise WireError("bad answer line: no request id")
    return fields[0], decode_outcome(fields[1:])


def _json_list(line: bytes, what: str) -> list[Any]:
    try:
        value = json.loads(line)
    except ValueError as exc:
        raise WireError(f"bad {what} line: {type(exc).__name__}") from None
    if not isinstance(value, list):
        raise WireError(f"bad {what} line: not a JSON array")
    return value


def _line(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode() + b"\n"


class LineSplitter:
    """Bytes in, complete lines out (without the newline); a line over
    :data:`MAX_LINE` is a :class:`WireError`."""

    def __init__(self) -> None:
        self._partial = b""

    def feed(self, data: bytes | bytearray) -> list[bytes]:
        *lines, self._partial = (self._partial + bytes(data)).split(b"\n")
        if len(self._partial) > MAX_LINE:
            raise WireError("line too long")
        return lines
