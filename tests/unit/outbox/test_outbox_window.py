"""The publisher's window: per-key waves across claims, keys held for the rest of the
cycle, and the rows in hand that bound what the claimer may claim next."""

from __future__ import annotations

import trio
import trio.testing

from actors.kafka.producer import OutMessage
from actors.outbox.messages import Claim, DeadLetter
from actors.outbox.rows import Malformed, Row
from actors.outbox.window import InHand, Window


def row(outbox_id: int, key: str, topic: str = "t", size: int = 10) -> Row:
    return Row(outbox_id, topic, key,
               OutMessage(outbox_id, topic, key.encode(), b"x" * size, ()))


def ids(rows: list[Row]) -> list[int]:
    return [r.id for r in rows]


def claimed(in_hand: InHand, *rows: Row | Malformed) -> Claim:
    """A claim as the claimer hands it over: its sendable rows counted in hand first."""
    in_hand.add([r for r in rows if isinstance(r, Row)])
    return Claim(list(rows), len(rows))


def never_due(_outbox_id: int) -> float:
    return 0.0


def test_waves_take_one_row_per_key_across_claims_and_free_room_as_rows_leave() -> None:
    """Rows of two claims form waves of at most one row per key, in id order; each row
    that leaves in a wave is taken off the rows in hand."""
    in_hand = InHand(max_rows=4, max_bytes=1_000)
    window = Window(in_hand)
    window.take(claimed(in_hand, row(1, "a"), row(2, "a")))
    window.take(claimed(in_hand, row(3, "b"), row(4, "a")))
    assert (in_hand.rows, in_hand.size, in_hand.has_room()) == (4, 40, False)
    assert ids(window.next_wave(0.0, never_due)) == [1, 3]
    assert (in_hand.rows, in_hand.size, in_hand.has_room()) == (2, 20, True)
    assert ids(window.next_wave(0.0, never_due)) == [2]
    assert ids(window.next_wave(0.0, never_due)) == [4]
    assert window.next_wave(0.0, never_due) == [] and (in_hand.rows, in_hand.size) == (0, 0)


def test_a_malformed_row_becomes_a_dead_letter_and_holds_its_key() -> None:
    """A malformed row comes back as a dead letter with its reason; no row of its key goes
    out in the rest of this cycle (the earlier one waits too, and goes first in a later
    cycle), other keys do, and the dropped rows leave the claimer room."""
    in_hand = InHand(max_rows=10, max_bytes=1_000)
    window = Window(in_hand)
    letters = window.take(claimed(in_hand, row(1, "a"), Malformed(2, "t", "a", "bad"),
                                  row(3, "a"), row(4, "b")))
    assert letters == [DeadLetter(2, "t", "a", "bad")]
    window.take(claimed(in_hand, row(5, "a")))
    assert (in_hand.rows, in_hand.size) == (2, 20), "rows 3 and 5 left with their key"
    assert ids(window.next_wave(0.0, never_due)) == [4]
    assert window.next_wave(0.0, never_due) == [] and in_hand.rows == 0
    assert window.seen_ids == {1, 2, 3, 4, 5}


def test_a_held_key_and_a_faulted_topic_leave_the_window() -> None:
    """After a row was not acknowledged its key's later rows wait; after the broker
    refused a topic, its rows wait (the first refusal is reported once)."""
    in_hand = InHand(max_rows=10, max_bytes=1_000)
    window = Window(in_hand)
    first = row(1, "a")
    window.take(claimed(in_hand, first, row(2, "b", topic="gone"), row(3, "a"), row(4, "c"),
                        row(5, "c")))
    assert ids(window.next_wave(0.0, never_due)) == [1, 2, 4]
    window.hold(first)
    assert window.fault("gone") and not window.fault("gone")
    assert ids(window.next_wave(0.0, never_due)) == [5]
    assert in_hand.rows == 0


def test_a_row_in_its_back_off_holds_its_key() -> None:
    """A row whose back-off is not over holds its key: neither it nor the later rows of
    its key go out, while other keys do."""
    window = Window(InHand(max_rows=10, max_bytes=1_000))
    window.take(claimed(window.in_hand, row(1, "a"), row(2, "b"), row(3, "a")))
    assert ids(window.next_wave(5.0, lambda i: 10.0 if i == 1 else 0.0)) == [2]
    assert window.next_wave(5.0, never_due) == []


def test_the_claimer_waits_for_room_in_bytes_until_a_wave_leaves() -> None:
    """Over the byte bound the claimer's wait for room blocks; it returns once a wave
    took enough rows out of the window."""
    in_hand = InHand(max_rows=100, max_bytes=25)
    window = Window(in_hand)
    window.take(claimed(in_hand, row(1, "a"), row(2, "a"), row(3, "a")))
    roomy: list[bool] = []

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            async def claimer() -> None:
                await in_hand.room()
                roomy.append(in_hand.has_room())
            nursery.start_soon(claimer)
            await trio.testing.wait_all_tasks_blocked()
            assert roomy == [], "30 bytes in hand: no room for a claim"
            assert ids(window.next_wave(0.0, never_due)) == [1]
            await trio.testing.wait_all_tasks_blocked()
            assert roomy == [True]

    trio.run(main)


def test_keys_fewer_than_counts_only_the_keys_a_wave_could_send() -> None:
    """The size of the next wave in keys: repeated keys count once, held keys and faulted
    topics not at all."""
    in_hand = InHand(max_rows=10, max_bytes=1_000)
    window = Window(in_hand)
    first = row(1, "a")
    window.take(claimed(in_hand, first, row(2, "a"), row(3, "b"), row(4, "c", topic="gone")))
    assert not window.keys_fewer_than(3) and window.keys_fewer_than(4)
    window.hold(first)
    window.fault("gone")
    assert window.keys_fewer_than(2) and not window.keys_fewer_than(1)
