"""The logical source's pure part: outbox rows out of pgoutput messages, and the rule that
the slot never passes an unsettled event."""

from __future__ import annotations

import pytest

from actors.outbox.pgoutput import PgOutputError
from actors.outbox.rows import Malformed, Row, parse_claimed
from actors.outbox.slot import SlotProgress, pieces, transactions
from tests.unit.outbox.test_outbox_pgoutput import MICROS, WHEN, begin, commit, insert, relation

OUTBOX_COLUMNS = [(1, "id", 20, -1), (0, "topic", 25, -1), (0, "message_key", 25, -1),
                  (0, "dedupe_key", 25, -1), (0, "event_type", 25, -1),
                  (0, "payload", 3802, -1), (0, "headers", 3802, -1),
                  (0, "created_at", 1184, -1), (0, "published_at", 1184, -1)]


def outbox_insert(outbox_id: int, key: str = "k", payload: bytes = b'{"a": 1}',
                  headers: bytes | None = b'{"source": "tests"}') -> bytes:
    return insert(7, str(outbox_id).encode(), b"t.topic", key.encode(), b"d" + bytes(
        str(outbox_id), "ascii"), b"Test", payload, headers, b"2025-01-01 00:00:00+00", None)


def txn(end_lsn: int, *inserts: bytes) -> list[tuple[int, bytes]]:
    return [(end_lsn - 100, begin(end_lsn - 50, MICROS, 9)), *((end_lsn - 40, i) for i in inserts),
            (end_lsn, commit(end_lsn - 50, end_lsn, MICROS))]


OUTBOX_RELATION = (1, relation(7, "messenger", "integration_outbox", OUTBOX_COLUMNS))


def test_a_peek_becomes_transactions_of_outbox_rows_built_as_the_claim_builds_them() -> None:
    records = [OUTBOX_RELATION, *txn(1000, outbox_insert(1), outbox_insert(2, "j")),
               *txn(2000, outbox_insert(3))]
    (first, second) = transactions(records, 1 << 20)
    assert (first.end_lsn, second.end_lsn) == (1000, 2000)
    assert first.commit_time == WHEN
    assert [row.id for row in first.rows] == [1, 2] and [r.id for r in second.rows] == [3]
    row = first.rows[0]
    assert isinstance(row, Row) and row.message.value == b'{"a": 1}'
    assert row.message.key == b"k" and row.topic == "t.topic"
    headers = dict(row.message.headers)
    assert headers["source"] == b"tests" and headers["event-type"] == b"Test"
    assert "event-id" in headers  # derived from topic + dedupe key, as the claim does


def test_transactions_read_already_are_left_out_and_a_trailing_one_waits() -> None:
    records = [OUTBOX_RELATION, *txn(1000, outbox_insert(1)), *txn(2000, outbox_insert(2)),
               *txn(3000, outbox_insert(3))[:-1]]
    assert [t.end_lsn for t in transactions(records, 1 << 20, after=1000)] == [2000]


def test_inserts_of_other_tables_are_ignored() -> None:
    other = relation(8, "messenger", "calls", [(1, "id", 20, -1)])
    records = [(1, other), *txn(1000, insert(8, b"5"))]
    assert transactions(records, 1 << 20)[0].rows == []


@pytest.mark.parametrize(("payload", "headers", "reason"), [
    (b"[1, 2]", b"{}", "malformed_row: payload is a JSON array, not an object"),
    (b"{}", b'{"n": 1}', "malformed_row: header 'n' is a JSON number, not a string"),
    (b'{"pad": "' + b"x" * 2000 + b'"}', b"{}", "too_large: row of"),
])
def test_bad_rows_come_as_malformed_with_the_tables_reasons(payload: bytes, headers: bytes,
                                                            reason: str) -> None:
    records = [OUTBOX_RELATION, *txn(1000, outbox_insert(1, payload=payload,
                                                         headers=headers))]
    (row,) = transactions(records, 1000)[0].rows
    assert isinstance(row, Malformed) and row.reason.startswith(reason)


def test_an_insert_before_its_relation_or_without_relay_columns_is_a_decoding_error() -> None:
    with pytest.raises(PgOutputError, match="relation 7 not described"):
        transactions(txn(1000, outbox_insert(1)), 1 << 20)
    bare = relation(7, "messenger", "integration_outbox", [(1, "id", 20, -1)])
    with pytest.raises(PgOutputError, match="no column topic, message_key"):
        transactions([(1, bare)], 1 << 20)


def test_the_slot_may_pass_only_the_settled_prefix_of_transactions() -> None:
    progress = SlotProgress()
    progress.begin_cycle(500)
    progress.add(1000, [1, 2])
    progress.add(2000, [3])
    progress.add(3000, [4])
    progress.settle([1, 3, 4])
    assert progress.passable() is None, "event 2 holds the slot before its transaction"
    progress.settle([2])
    assert progress.passable() == 3000
    progress.advanced(3000)
    assert progress.passable() is None and progress.open_events == 0


def test_events_settled_above_the_slot_are_not_sent_again_by_the_next_cycle() -> None:
    progress = SlotProgress()
    progress.begin_cycle(0)
    progress.add(1000, [1])
    progress.add(2000, [2, 3])
    progress.settle([2, 3])  # a later key went on while event 1 waits for its back-off
    assert progress.passable() is None
    progress.begin_cycle(0)  # the next cycle reads both again
    assert progress.add(1000, [1]) == set()
    assert progress.add(2000, [2, 3]) == {2, 3}
    assert progress.open_events == 1
    progress.settle([1])
    assert progress.passable() == 2000
    progress.advanced(2000)
    assert progress.settled == {}, "what the slot passed is forgotten"


def test_an_idle_peek_lets_the_slot_move_only_when_nothing_read_waits() -> None:
    progress = SlotProgress()
    progress.begin_cycle(100)
    progress.add(1000, [1])
    progress.caught_up(5000)
    assert progress.passable() is None
    progress.settle([1])
    assert progress.passable() == 5000


def test_a_restart_forgets_settled_events_and_sends_them_again() -> None:
    """Memory is the only record of events settled above the slot: a fresh relay sends
    them again (at least once; duplicates bounded by that window)."""
    before = SlotProgress()
    before.begin_cycle(0)
    before.add(1000, [1])
    before.add(2000, [2])
    before.settle([2])
    fresh = SlotProgress()
    fresh.begin_cycle(0)
    fresh.add(1000, [1])
    assert fresh.add(2000, [2]) == set()
    assert before.settled == {2000: {2}}


def test_a_large_transaction_is_cut_into_pieces_and_small_ones_share_one() -> None:
    big = transactions([OUTBOX_RELATION, *txn(1000, *(outbox_insert(i) for i in range(1, 8)))],
                       1 << 20)
    small = transactions([OUTBOX_RELATION, *txn(2000, outbox_insert(8)),
                          *txn(3000, outbox_insert(9))], 1 << 20)
    cut = pieces(big + small, 3)
    assert [[(s.txn.end_lsn, s.start, s.stop) for s in p.spans] for p in cut] == [
        [(1000, 0, 3)], [(1000, 3, 6)], [(1000, 6, 7), (2000, 0, 1), (3000, 0, 1)]]
    assert [p.last for p in cut] == [False, False, True]
    ids = [row.id for p in cut for s in p.spans for row in s.txn.decode(s.start, s.stop)]
    assert ids == list(range(1, 10))


def test_the_slot_passes_no_part_of_a_transaction_until_its_last_piece_is_read() -> None:
    progress = SlotProgress()
    progress.begin_cycle(500)
    progress.add(1000, [1, 2], complete=False)
    progress.settle([1, 2])
    assert progress.passable() is None, "the rest of the transaction is not read yet"
    assert progress.read_upto == 0, "a peek must read the transaction again"
    progress.add(1000, [3], complete=True)
    assert progress.unpassed_events == 3 and progress.passable_events() == 0
    progress.settle([3])
    assert progress.passable() == 1000 and progress.passable_events() == 3
    progress.advanced(1000)
    assert progress.unpassed_events == 0


def test_the_fast_path_builds_the_same_message_as_the_claim() -> None:
    """An object payload with string headers is built from the message's bytes; the same
    row through the claim's parser (as a table-source claim returns it) is identical."""
    payload, headers = b'{"a": "\xc3\xa9"}', b'{"source": "tests", "event-id": "x"}'
    (row,) = transactions([OUTBOX_RELATION, *txn(1000, outbox_insert(
        5, "ké", payload, headers))], 1 << 20)[0].rows
    claimed = parse_claimed((5, "t.topic", "ké", "d5", "Test",
                             payload.decode(), "object", headers.decode(), 0, False, 0))
    assert row == claimed
    assert isinstance(row, Row) and row.message.value == payload
