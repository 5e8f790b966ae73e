"""The pgoutput decoder on messages built byte by byte from the documented format
(PostgreSQL manual, "Logical Replication Message Formats", protocol version 1)."""

from __future__ import annotations

import struct
from datetime import UTC, datetime, timedelta

import pytest

from actors.outbox.pgoutput import (
    UNCHANGED,
    Begin,
    Column,
    Commit,
    Insert,
    PgOutputError,
    Relation,
    Skipped,
    decode,
    format_lsn,
    insert_texts,
)

EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
WHEN = datetime(2025, 3, 4, 5, 6, 7, 891011, tzinfo=UTC)
MICROS = (WHEN - EPOCH) // timedelta(microseconds=1)


def cstr(text: str) -> bytes:
    return text.encode() + b"\0"


def begin(final_lsn: int, micros: int, xid: int) -> bytes:
    return b"B" + struct.pack("!q", final_lsn) + struct.pack("!q", micros) + struct.pack(
        "!I", xid)


def commit(commit_lsn: int, end_lsn: int, micros: int) -> bytes:
    return (b"C" + bytes([0]) + struct.pack("!q", commit_lsn) + struct.pack("!q", end_lsn)
            + struct.pack("!q", micros))


def relation(relid: int, namespace: str, name: str,
             columns: list[tuple[int, str, int, int]]) -> bytes:
    out = b"R" + struct.pack("!I", relid) + cstr(namespace) + cstr(name) + b"d"
    out += struct.pack("!h", len(columns))
    for flags, column, oid, modifier in columns:
        out += bytes([flags]) + cstr(column) + struct.pack("!I", oid) + struct.pack("!i",
                                                                                   modifier)
    return out


def tuple_data(*values: bytes | str | None) -> bytes:
    out = struct.pack("!h", len(values))
    for value in values:
        if value is None:
            out += b"n"
        elif value == "u":
            out += b"u"
        else:
            assert isinstance(value, bytes)
            out += b"t" + struct.pack("!I", len(value)) + value
    return out


def insert(relid: int, *values: bytes | str | None) -> bytes:
    return b"I" + struct.pack("!I", relid) + b"N" + tuple_data(*values)


def test_begin_gives_the_commit_lsn_commit_time_and_xid() -> None:
    assert decode(begin(0x16_B374D848, MICROS, 4_000_000_000)) == Begin(
        0x16_B374D848, WHEN, 4_000_000_000)


def test_commit_gives_its_end_lsn_and_commit_time() -> None:
    assert decode(commit(0x100, 0x128, MICROS)) == Commit(0, 0x100, 0x128, WHEN)


def test_relation_gives_the_table_and_its_columns_in_order() -> None:
    message = decode(relation(16384, "messenger", "integration_outbox",
                              [(1, "id", 20, -1), (0, "topic", 25, -1)]))
    assert message == Relation(16384, "messenger", "integration_outbox", "d",
                               (Column(1, "id", 20, -1), Column(0, "topic", 25, -1)))
    assert isinstance(message, Relation) and message.columns[0].is_key


def test_relation_of_pg_catalog_has_an_empty_namespace_on_the_wire() -> None:
    message = decode(relation(11, "", "pg_class", []))
    assert isinstance(message, Relation) and message.namespace == "pg_catalog"


def test_insert_gives_text_values_nulls_and_unchanged_toast() -> None:
    message = decode(insert(16384, b"42", None, "u", b'{"a": "\xc3\xa9"}', b""))
    assert message == Insert(16384, (b"42", None, UNCHANGED, b'{"a": "\xc3\xa9"}', b""))


@pytest.mark.parametrize("tag", list("OYUDTM"))
def test_messages_the_relay_does_not_use_are_skipped_by_tag(tag: str) -> None:
    assert decode(tag.encode() + b"\x00\x01anything") == Skipped(tag)


@pytest.mark.parametrize(("data", "problem"), [
    (b"", "no tag"),
    (b"Z\x00", "unknown tag b'Z'"),
    (begin(1, 2, 3)[:-1], "Begin message of 20 bytes: 20 bytes expected, 19 left"),
    (begin(1, 2, 3) + b"\x00", "Begin message of 22 bytes: 1 bytes left over"),
    (commit(1, 2, 3)[:10], "Commit message of 10 bytes"),
    (b"R" + struct.pack("!I", 1) + b"messenger", "string without its terminating zero"),
    (relation(1, "s", "t", [(0, "c", 25, -1)])[:-3], "Relation message"),
    (insert(1, b"abc")[:-1], "value of 3 bytes, 2 left"),
    (b"I" + struct.pack("!I", 1) + b"K" + tuple_data(b"1"), "new tuple marker b'K'"),
    (b"I" + struct.pack("!I", 1) + b"N" + struct.pack("!h", 1) + b"b"
     + struct.pack("!I", 1) + b"x", "column kind b'b'"),
    (b"I" + struct.pack("!I", 1) + b"N" + struct.pack("!h", -1), "-1 columns"),
    (b"R" + struct.pack("!I", 1) + b"\xff\0t\0d" + struct.pack("!h", 0), "not UTF-8"),
])
def test_a_malformed_message_is_a_typed_error_naming_the_problem(data: bytes,
                                                                 problem: str) -> None:
    with pytest.raises(PgOutputError, match="pgoutput") as caught:
        decode(data)
    assert problem in str(caught.value)


def test_lsns_are_written_as_postgresql_writes_them() -> None:
    assert format_lsn(0x16_B374D848) == "16/B374D848"
    assert format_lsn(0) == "0/0"


def test_the_fast_insert_read_gives_the_same_texts_and_nulls_as_decode() -> None:
    data = insert(16384, b"42", None, b'{"a": "\xc3\xa9"}', b"")
    message = decode(data)
    assert isinstance(message, Insert)
    assert insert_texts(data, 4) == list(message.values)
    assert insert_texts(data, 2) == list(message.values[:2]), "the columns after: not read"
    assert insert_texts(data, 5) is None, "fewer columns than asked for"


@pytest.mark.parametrize("data", [
    insert(1, b"1", "u", b"x"),  # an unchanged TOAST value: decode says what it is
    insert(1, b"1", b"abc")[:-1],  # a value cut short
    b"I" + struct.pack("!I", 1) + b"K" + tuple_data(b"1"),  # not a new tuple
    b"I" + struct.pack("!I", 1) + b"N" + struct.pack("!h", 2) + b"t" + struct.pack("!I", 1)
    + b"x" + b"b" + struct.pack("!I", 1) + b"y",  # a binary column
    b"I" + struct.pack("!I", 1) + b"N",  # no column count
    begin(1, 2, 3),  # not an Insert
])
def test_the_fast_insert_read_leaves_anything_odd_to_the_checked_decode(data: bytes) -> None:
    assert insert_texts(data, 2) is None
