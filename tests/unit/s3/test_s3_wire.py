"""The S3 worker's line protocol carries every outcome and rejects what it cannot read."""

from __future__ import annotations

import json

import pytest

from actors.s3.objectstore import Fault, Found, HeadOutcome, Missing, Poison, Transient
from actors.s3.wire import (
    MAX_LINE,
    OP_OBJECT,
    Bucket,
    Credentials,
    LineSplitter,
    decode_answer,
    decode_input,
    decode_request,
    decode_settings,
    encode_answer,
    encode_credentials,
    encode_request,
    encode_settings,
)
from supervision.config import S3Config
from supervision.errors import WireError
from supervision.secrets import Secret

OUTCOMES: list[HeadOutcome] = [
    Found("call-recordings/r1", 1024, "Webm", 42), Missing(), Transient("http_503"),
    Fault("access_denied_http_403"), Poison("content_type_unknown:text/plain"),
]


@pytest.mark.parametrize("outcome", OUTCOMES, ids=lambda o: type(o).__name__)
def test_every_outcome_survives_the_pipe_unchanged(outcome: HeadOutcome) -> None:
    """An answer decodes to the request id and an outcome equal to the one encoded."""
    line = encode_answer(7, outcome)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert decode_answer(line.rstrip(b"\n")) == (7, outcome)


def test_settings_carry_the_credentials_to_the_worker() -> None:
    """The worker gets the same S3 settings and the credentials, as Secret values; the
    static key fields of the config do not travel (the credentials stand for them)."""
    cfg = S3Config(endpoint_url="https://127.0.0.1:9", bucket="b", key_prefix="p/",
                   access_key_id=Secret("AKID"), secret_access_key=Secret("s3cr3t"),
                   timeout=1.5, concurrency=3, addressing_style="virtual",
                   ca_file="/etc/ca.pem")
    creds = Credentials(Secret("ASIA1"), Secret("s3cr3t"), Secret("tok3n"))
    decoded = decode_settings(encode_settings(cfg, creds))
    assert decoded.s3 == Bucket(endpoint_url="https://127.0.0.1:9", region="us-east-1",
                                bucket="b", key_prefix="p/", timeout=1.5, concurrency=3,
                                addressing_style="virtual", ca_file="/etc/ca.pem")
    assert b"AKID" not in encode_settings(cfg, creds)  # the config's keys never travel
    assert decoded.credentials == creds
    assert decoded.credentials.session_token.reveal() == "tok3n"
    assert decode_settings(encode_settings(cfg, None)).credentials is None


def test_new_credentials_are_told_apart_from_requests() -> None:
    """A credentials line decodes as Credentials, a request line as a request; a
    credentials line with a missing or non-string field is a WireError."""
    creds = Credentials(Secret("ASIA2"), Secret("sk"), Secret(""))
    line = encode_credentials(creds)
    assert line.count(b"\n") == 1
    assert decode_input(line) == creds
    assert decode_input(encode_request(4, OP_OBJECT, "r")) == (4, OP_OBJECT, "r")
    for bad in (b'["credentials","a","b"]', b'["credentials","a","b",3]'):
        with pytest.raises(WireError, match="credentials"):
            decode_input(bad)


def test_request_round_trip_and_unknown_operation_is_rejected() -> None:
    """A request decodes as sent; an operation the worker does not know is a WireError."""
    line = encode_request(3, OP_OBJECT, "a b\n\"c\"")  # odd ids stay on one line
    assert line.count(b"\n") == 1
    assert decode_request(line) == (3, OP_OBJECT, "a b\n\"c\"")
    with pytest.raises(WireError, match="unexpected fields"):
        decode_request(json.dumps([3, "delete", "x"]).encode())
    for line in (b"7", b'{"a": 1, "b": 2, "c": 3}', b"[1, 2]"):
        with pytest.raises(WireError):
            decode_request(line)


@pytest.mark.parametrize("line", [
    b"not json", b"[]", b"5", b'{"1": "missing"}', b'["x","missing"]',
    b'[1,"found","k","big","Webm",3]', b'[1,"exploded","boom"]', b'[1,"transient"]',
])
def test_malformed_answers_are_wire_errors(line: bytes) -> None:
    """Garbage from the worker is reported as a WireError, never as an outcome."""
    with pytest.raises(WireError):
        decode_answer(line)


def test_malformed_settings_are_a_wire_error() -> None:
    """A settings line without a required field is a WireError naming no value."""
    with pytest.raises(WireError, match="KeyError"):
        decode_settings(b'{"endpoint_url": "http://x"}')


def test_line_splitter_joins_lines_split_across_reads() -> None:
    """Lines cut anywhere by the pipe come out whole, in order; the tail waits."""
    splitter = LineSplitter()
    assert splitter.feed(b'[1,"mis') == []
    assert splitter.feed(bytearray(b'sing"]\n[2,"missing"]\n[3')) == [
        b'[1,"missing"]', b'[2,"missing"]']
    assert splitter.feed(b',"missing"]\n') == [b'[3,"missing"]']


def test_line_splitter_refuses_an_endless_line() -> None:
    """A peer that never sends a newline cannot grow the buffer without bound."""
    splitter = LineSplitter()
    with pytest.raises(WireError, match="too long"):
        splitter.feed(b"x" * (MAX_LINE + 1))
