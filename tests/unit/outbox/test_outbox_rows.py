"""Outbox rows written by any service: a well-formed row becomes a Kafka message, a
malformed one a dead letter with a one-line reason; waves keep per-key order."""

from __future__ import annotations

import json
from typing import Any

import pytest

from actors.envelope import event_id
from actors.outbox.rows import (
    CLAIMED,
    Malformed,
    Row,
    next_wave,
    parse_claimed,
    parse_row,
    string_object,
)


def record(payload: Any = None, headers: Any = None, **overrides: Any) -> dict[str, Any]:
    """A claimed record as ``outbox_claim_batch`` returns it (payload as text + its type)."""
    payload = {"RecordingId": "r1"} if payload is None else payload
    rec = {"id": 7, "topic": "t", "message_key": "k", "dedupe_key": "d", "event_type": "E",
           "payload": json.dumps(payload), "headers": {} if headers is None else headers,
           "payload_type": {dict: "object", list: "array", str: "string", int: "number",
                            bool: "boolean"}[type(payload)], "publish_attempts": 0,
           "size": 100, "oversized": False, "claimed_n": 1}
    rec.update(overrides)
    return rec


def as_claimed(rec: dict[str, Any]) -> tuple[Any, ...]:
    """*rec* as the claim's tuple: the columns of :data:`CLAIMED`, the headers as JSON
    text (``headers::text``)."""
    return tuple(json.dumps(rec[column]) if column == "headers" else rec[column]
                 for column in CLAIMED)


def test_well_formed_row_gets_the_missing_spec_headers() -> None:
    """A row without event-id/content-type gets them; its payload is sent as stored."""
    row = parse_row(record(headers={"source": "messenger"}))
    assert isinstance(row, Row)
    headers = dict(row.message.headers)
    assert headers == {"source": b"messenger", "event-type": b"E",
                       "event-id": event_id("t", "d").encode(),
                       "content-type": b"application/json"}
    assert row.message.value == b'{"RecordingId": "r1"}' and row.message.key == b"k"


def test_json_null_headers_mean_no_headers() -> None:
    """``headers = 'null'::jsonb`` is read as no headers, not as a malformed row."""
    rec = record()
    rec["headers"] = None
    assert isinstance(parse_row(rec), Row)


@pytest.mark.parametrize(("overrides", "reason"), [
    ({"headers": [1, 2]}, "malformed_row: headers is a JSON array, not an object"),
    ({"headers": "x"}, "malformed_row: headers is a JSON string, not an object"),
    ({"headers": {"event-id": 5}}, "malformed_row: header 'event-id' is a JSON number,"
                                   " not a string"),
    ({"headers": {"a": None}}, "malformed_row: header 'a' is a JSON null, not a string"),
    ({"headers": {"a": {"b": "c"}}}, "malformed_row: header 'a' is a JSON object,"
                                     " not a string"),
    ({"headers": {"a": True}}, "malformed_row: header 'a' is a JSON boolean, not a string"),
    ({"payload": "\"text\"", "payload_type": "string"},
     "malformed_row: payload is a JSON string, not an object"),
    ({"payload": "42", "payload_type": "number"},
     "malformed_row: payload is a JSON number, not an object"),
    ({"payload": "[]", "payload_type": "array"},
     "malformed_row: payload is a JSON array, not an object"),
    ({"payload": "null", "payload_type": "null"},
     "malformed_row: payload is a JSON null, not an object"),
])
def test_malformed_row_is_reported_with_its_reason(overrides: dict[str, Any],
                                                   reason: str) -> None:
    """Valid JSON of the wrong shape is never sent (nor crashes the relay): it says why."""
    assert parse_row(record(**overrides)) == Malformed(7, "t", "k", reason)


def test_malformed_reason_names_at_most_64_characters_of_a_header() -> None:
    """A huge header name cannot blow up the one-line reason."""
    parsed = parse_row(record(headers={"h" * 10_000: 1}))
    assert isinstance(parsed, Malformed) and len(parsed.reason) < 140


def rows(*spec: tuple[int, str]) -> list[Row]:
    out = []
    for outbox_id, key in spec:
        parsed = parse_row(record(id=outbox_id, message_key=key))
        assert isinstance(parsed, Row)
        out.append(parsed)
    return out


def test_a_wave_holds_one_row_per_key_and_keeps_the_rest_in_id_order() -> None:
    """Rows of a key land in successive waves; other keys share the first wave."""
    window = rows((1, "a"), (2, "a"), (3, "b"), (4, "a"))
    plan = []
    while window:
        wave, window = next_wave(window, set(), 0.0, lambda _id: 0.0)
        plan.append([r.id for r in wave])
    assert plan == [[1, 3], [2], [4]]


def test_a_row_in_back_off_holds_back_the_rest_of_its_key() -> None:
    """Row 2 is not due: it and row 4 (same key, later) wait; row 1 and 3 go."""
    held: set[tuple[str, str]] = set()
    wave, rest = next_wave(rows((1, "a"), (2, "b"), (3, "c"), (4, "b")), held, 10.0,
                           lambda outbox_id: 11.0 if outbox_id == 2 else 0.0)
    assert [r.id for r in wave] == [1, 3] and rest == []
    assert {key for _, key in held} == {"b"}


def test_a_held_key_stays_held_for_rows_claimed_later() -> None:
    """A key held earlier in the cycle (a failed row) drops its rows from later claims,
    also rows kept for a later wave before the key was held."""
    held = {("t", "a")}
    wave, rest = next_wave(rows((5, "a"), (6, "b"), (7, "b")), held, 0.0, lambda _id: 0.0)
    assert [r.id for r in wave] == [6] and [r.id for r in rest] == [7]
    held.add(("t", "b"))  # row 6 failed: row 7, kept for a later wave, stays behind
    wave, rest = next_wave(rest + rows((8, "b"), (9, "c")), held, 0.0, lambda _id: 0.0)
    assert [r.id for r in wave] == [9] and rest == []


@pytest.mark.parametrize("overrides", [
    {},
    {"headers": {"source": "messenger"}},
    {"headers": {"event-type": "Own", "event-id": "e-1", "content-type": "text/plain"}},
    {"headers": {"b": "2", "a": "1", "event-id": "kept"}},
    {"headers": None},
    {"headers": [1, 2]},
    {"headers": {"a": "1", "b": 5}},
    {"headers": {"a": None}},
    {"payload": "[]", "payload_type": "array"},
], ids=["no-headers", "some", "all-spec-headers", "order", "json-null", "array",
        "number-value", "null-value", "array-payload"])
def test_the_claim_fast_path_builds_exactly_what_parse_row_builds(
        overrides: dict[str, Any]) -> None:
    """parse_claimed (the relay's path, a tuple record) and parse_row agree on every
    record: the same message, headers in the same order, or the same malformed reason."""
    rec = record(**overrides)
    assert parse_claimed(as_claimed(rec)) == parse_row(rec)


def test_an_oversized_claimed_row_is_malformed_with_its_size_and_the_limit() -> None:
    """A row the claim measured over the limit (fetched without payload or headers) is a
    dead letter whose reason names its size and the limit, never a message."""
    rec = record(payload={"x": 1}) | {"payload": None, "headers": None, "dedupe_key": None,
                                      "event_type": None, "size": 52_428_800,
                                      "oversized": True}
    parsed = parse_claimed(tuple(rec[column] for column in CLAIMED), 1_048_576)  # SQL NULLs
    assert parsed == Malformed(7, "t", "k", "too_large: row of 52428800 bytes over the"
                                            " 1048576-byte max request size")


def test_headers_of_strings_are_decoded_as_the_standard_library_decodes_them() -> None:
    text = '{"event-id": "e1", "source": "s\\u00e9", "empty": ""}'
    assert string_object(text) == json.loads(text)
    assert string_object(text.encode()) == json.loads(text)


@pytest.mark.parametrize("text", [
    '{"n": 123456789012345678901234567890}',  # orjson would read a float: json says why
    '{"n": 1}',
    '["e1"]',
    'null',
    '{"event-id": ',
])
def test_headers_not_an_object_of_strings_are_left_to_the_standard_library(
        text: str) -> None:
    assert string_object(text) is None
