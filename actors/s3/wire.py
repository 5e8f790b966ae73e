"""The line protocol between the daemon and its S3 worker process (``s3_worker``).

>>> decode_outcome(encode_outcome(Found("k", 10, "Webm", 3)))
Found(file_id='k', size_bytes=10, format='Webm', duration_seconds=3)

One JSON value per line, UTF-8. The first line the daemon sends is the worker's
configuration (:func:`encode_settings`, the current credentials included — a pipe, never
argv or the environment). Then requests ``[id, op, recording_id]`` with ``op`` one of
:data:`OPERATIONS` (``list``: a ListObjectsV2 under the prefix, the others HEADs),
and, whenever the daemon's credentials change (temporary credentials refreshed before
they expire), ``["credentials", key_id, secret, session_token]``
(:func:`encode_credentials`): the worker signs every request it starts from then on with
them. Answers are ``[id, tag, *fields]`` in any order, where the tag names the outcome
class. Pure functions and a line splitter: unit-tested without processes.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import attrs

from actors.s3.objectstore import Fault, Found, HeadOutcome, Missing, Poison, Transient
from supervision.errors import WireError
from supervision.secrets import Secret

if TYPE_CHECKING:  # the worker process never imports the configuration (nor psycopg)
    from supervision.config import S3Config

OP_OBJECT, OP_BUCKET, OP_CANARY, OP_LIST = "object", "bucket", "canary", "list"
OPERATIONS = (OP_OBJECT, OP_BUCKET, OP_CANARY, OP_LIST)
_ERROR_TAGS: dict[str, type[Transient | Fault | Poison]] = {
    "transient": Transient, "fault": Fault, "poison": Poison,
}
MAX_LINE = 64 * 1024


CREDENTIALS_TAG = "credentials"


@attrs.frozen
class Credentials:
    """The keys that sign a request; *session_token* is set for temporary credentials
    (sent as ``x-amz-security-token``)."""

    access_key_id: Secret
    secret_access_key: Secret
    session_token: Secret = Secret("")


@attrs.frozen
class Bucket:
    """What the worker is told of ``[s3]``: where the bucket is and how to talk to it. The
    static keys are not here: they travel as :attr:`Settings.credentials`."""

    endpoint_url: str
    region: str
    bucket: str
    key_prefix: str
    timeout: float
    concurrency: int
    addressing_style: str
    ca_file: str

    @classmethod
    def of(cls, cfg: S3Config) -> Bucket:
        return cls(cfg.endpoint_url, cfg.region, cfg.bucket, cfg.key_prefix, cfg.timeout,
                   cfg.concurrency, cfg.addressing_style, cfg.ca_file)


@attrs.frozen
class Settings:
    """What the worker is started with: the bucket and the credentials, None = unsigned."""

    s3: Bucket
    credentials: Credentials | None


def _credential_fields(creds: Credentials) -> list[str]:
    return [creds.access_key_id.reveal(), creds.secret_access_key.reveal(),
            creds.session_token.reveal()]


def _credentials_from(fields: Any) -> Credentials:
    if (not isinstance(fields, list) or len(fields) != 3
            or not all(isinstance(f, str) for f in fields)):
        raise WireError("bad credentials: unexpected fields")
    return Credentials(*(Secret(f) for f in fields))


def encode_settings(cfg: S3Config, credentials: Credentials | None) -> bytes:
    fields: dict[str, Any] = attrs.asdict(Bucket.of(cfg))
    fields["credentials"] = None if credentials is None else _credential_fields(credentials)
    return _line(fields)


def decode_settings(line: bytes) -> Settings:
    try:
        fields = json.loads(line)
        s3 = Bucket(
            endpoint_url=str(fields["endpoint_url"]), region=str(fields["region"]),
            bucket=str(fields["bucket"]), key_prefix=str(fields["key_prefix"]),
            timeout=float(fields["timeout"]), concurrency=int(fields["concurrency"]),
            addressing_style=str(fields["addressing_style"]), ca_file=str(fields["ca_file"]),
        )
        creds = fields["credentials"]
    except (ValueError, TypeError, KeyError) as exc:
        raise WireError(f"bad settings line: {type(exc).__name__}") from None
    return Settings(s3, None if creds is None else _credentials_from(creds))


def encode_credentials(credentials: Credentials) -> bytes:
    return _line([CREDENTIALS_TAG, *_credential_fields(credentials)])


def encode_request(request_id: int, op: str, recording_id: str) -> bytes:
    return _line([request_id, op, recording_id])


def decode_input(line: bytes) -> tuple[int, str, str] | Credentials:
    """A line after the settings: a request, or new credentials."""
    fields = _json_list(line, "request")
    if fields and fields[0] == CREDENTIALS_TAG:
        return _credentials_from(fields[1:])
    return _request_from(fields)


def decode_request(line: bytes) -> tuple[int, str, str]:
    return _request_from(_json_list(line, "request"))


def _request_from(fields: list[Any]) -> tuple[int, str, str]:
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
