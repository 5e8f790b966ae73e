"""Outbox rows as the relay sees them: parsing a claimed row, and the per-key waves.

>>> parsed = parse_claimed(record)  # a claimed row: a Row ready to send, or Malformed
>>> wave, window = next_wave(window, held, now, due_at)  # at most one row per key

``messenger.integration_outbox`` is written by other services too, so a row is checked
before it becomes a Kafka message: ``payload`` must be a JSON object (it is sent as it is
stored) and ``headers`` a JSON object whose values are strings (JSON ``null`` means no
headers), and the row no larger than the producer's max request size: the claim measures
each row in the database and sends an oversized one without its payload and headers
(issue #26: twenty 50 MB rows took the relay to 2.2 GB). Anything else is
:class:`Malformed`, with a one-line reason, and the relay dead-letters it like a message
the broker rejects.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import orjson

from actors.envelope import event_id
from actors.kafka.producer import OutMessage


@attrs.define  # not frozen: a frozen class's __init__ costs twice as much, per row
class Row:
    """A claimed row ready to send (never changed after parsing)."""

    id: int
    topic: str
    message_key: str
    message: OutMessage


@attrs.frozen
class Malformed:
    """A row that cannot become a Kafka message; *reason* says why, in one line."""

    id: int
    topic: str
    message_key: str
    reason: str


def json_type(value: object) -> str:
    """The JSON type name of a decoded JSON value (as ``jsonb_typeof`` spells it)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _headers_problem(headers: object) -> str | None:
    if not isinstance(headers, dict):
        return f"headers is a JSON {json_type(headers)}, not an object"
    for name, value in headers.items():
        if not isinstance(value, str):
            return f"header {name[:64]!r} is a JSON {json_type(value)}, not a string"
    return None


def parse_row(rec: dict[str, Any]) -> Row | Malformed:
    """A claimed record (``outbox_claim_batch``) as a message, or why it cannot be one."""
    headers = {} if rec["headers"] is None else rec["headers"]
    problem = _headers_problem(headers)
    if rec["payload_type"] != "object":
        problem = f"payload is a JSON {rec['payload_type']}, not an object"
    if problem is not None:
        return Malformed(rec["id"], rec["topic"], rec["message_key"], f"malformed_row: {problem}")
    headers = dict(headers)
    headers.setdefault("event-type", rec["event_type"])
    if "event-id" not in headers:  # writers other than safetynet may leave it out
        headers["event-id"] = event_id(rec["topic"], rec["dedupe_key"])
    headers.setdefault("content-type", "application/json")
    message = OutMessage(
        outbox_id=rec["id"], topic=rec["topic"], key=rec["message_key"].encode(),
        value=rec["payload"].encode(),
        headers=tuple((k, v.encode()) for k, v in headers.items()),
    )
    return Row(rec["id"], rec["topic"], rec["message_key"], message)


CLAIMED = ("id", "topic", "message_key", "dedupe_key", "event_type", "payload",
           "payload_type", "headers", "size", "oversized",
           "claimed_n")  # the columns of outbox_claim_batch, in order


def string_object(text: str | bytes) -> dict[str, str] | None:
    """JSON text that is an object of strings (a row's headers, in the common case),
    decoded by orjson — once per event on the relay's path in both sources, at a sixth of
    the standard library's time; None for anything else, which the standard library's
    ``json`` then reads, so a malformed row's reason is the same as ever (orjson reads an
    integer past 64 bits as a float)."""
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    if type(value) is not dict or not all(type(v) is str for v in value.values()):
        return None
    return value


def too_large(size: int, limit: int) -> str:
    """The dead letter's reason for a row of *size* bytes over *limit*."""
    return f"too_large: row of {size} bytes over the {limit}-byte max request size"


def parse_claimed(rec: tuple[Any, ...], max_row_bytes: int = 0) -> Row | Malformed:
    """A row as ``outbox_claim_batch`` returns it (a tuple of :data:`CLAIMED`, its headers
    as JSON text): the common case (an object payload, headers a JSON object of strings)
    without building a dict of the record, giving the same message as :func:`parse_row`;
    an oversized row (fetched without payload) is :class:`Malformed`; anything else goes
    through :func:`parse_row`.

    The claim fetches the headers as text and they are decoded here
    (:func:`string_object`):
    ``json.loads`` of a ``str`` cost a third of psycopg's ``jsonb`` loader, which decodes
    bytes (and was 80% of the claim's fetch, on the relay's critical path;
    docs/benchmarks.md), and orjson a sixth of that."""
    (outbox_id, topic, message_key, dedupe_key, event_type, payload, payload_type,
     headers_json, size, oversized, _) = rec
    if oversized:
        return Malformed(outbox_id, topic, message_key, too_large(size, max_row_bytes))
    strings = None if headers_json is None else string_object(headers_json)
    if payload_type == "object" and strings is not None:
        row = object_row(outbox_id, topic, message_key, message_key.encode(),
                         payload.encode(), strings, event_type, dedupe_key)
        if row is not None:
            return row
    headers = None if headers_json is None else json.loads(headers_json)
    return parse_row(dict(zip(CLAIMED, rec, strict=True)) | {"headers": headers})


def object_row(outbox_id: int, topic: str, message_key: str, key: bytes, payload: bytes,
               headers: dict[str, Any], event_type: str | bytes,
               dedupe_key: str | bytes | None) -> Row | None:
    """The common case of both sources: an object payload and headers a JSON object of
    strings, as the message goes out (the SPEC §4 headers the writer left out added);
    None when a header is not a string (:func:`parse_row` says how it is malformed)."""
    try:  # only a string has .encode() among decoded JSON values
        wire = {name: value.encode() for name, value in headers.items()}
    except AttributeError:
        return None
    if "event-type" not in wire:
        wire["event-type"] = (event_type if isinstance(event_type, bytes)
                              else event_type.encode())
    if "event-id" not in wire:  # writers other than safetynet may leave it out
        dedupe = dedupe_key.decode() if isinstance(dedupe_key, bytes) else str(dedupe_key)
        wire["event-id"] = event_id(topic, dedupe).encode()
    if "content-type" not in wire:
        wire["content-type"] = b"application/json"
    return Row(outbox_id, topic, message_key,
               OutMessage(outbox_id, topic, key, payload, tuple(wire.items())))


Key = tuple[str, str]  # (topic, message_key)


def next_wave(window: Sequence[Row], held: set[Key], now: float,
              due_at: Callable[[int], float]) -> tuple[list[Row], list[Row]]:
    """The next wave out of *window* (claimed rows in id order, not yet sent): the first
    row of every key that is not held, in id order, and the rows left for later waves.

    A row still in its back-off (``due_at(id) > now``) holds its key: the key is added to
    *held*, and the rows of a held key are dropped from the window (they and every later
    row of the key wait for a later cycle)."""
    wave: list[Row] = []
    rest: list[Row] = []
    seen: set[Key] = set()
    for row in window:
        key = (row.topic, row.message_key)
        if key in held:
            continue
        if key in seen:
            rest.append(row)
        elif due_at(row.id) > now:
            held.add(key)
        else:
            seen.add(key)
            wave.append(row)
    return wave, rest
