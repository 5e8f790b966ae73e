"""The relay cycle's ledger: what the claimer, the window and the marker tell each other
about the rows in flight."""

from __future__ import annotations

import attrs
import pytest

from actors.kafka.producer import OutMessage
from actors.outbox.cycle import CycleLedger
from actors.outbox.rows import Malformed, Row
from actors.outbox.settings import OutboxRelayConfig
from actors.outbox.state import RelayCounts


def row(outbox_id: int, size: int = 10) -> Row:
    return Row(outbox_id, "t", "k", OutMessage(outbox_id, "t", b"k", b"x" * size, ()))


def test_claimed_rows_are_unmarked_and_only_sendable_ones_in_hand() -> None:
    """A claim's ids all wait for the marker; a malformed row takes no room in hand."""
    ledger = CycleLedger.for_config(OutboxRelayConfig())
    ledger.claimed([row(3, 7), Malformed(1, "t", "k", "payload: not an object"), row(2, 5)])
    assert ledger.skip() == [1, 2, 3]
    assert (ledger.in_hand.rows, ledger.in_hand.size) == (2, 12)


def test_marked_ids_are_no_longer_skipped() -> None:
    ledger = CycleLedger.for_config(OutboxRelayConfig())
    ledger.claimed([row(1), row(2), row(3)])
    ledger.marked([1, 3])
    assert ledger.skip() == [2]


def test_the_rows_in_hand_hold_about_two_claims() -> None:
    """Room for ``2 x batch_size`` rows and ``claim_max_bytes`` of payloads; the counts
    handed in are the ones the cycle reports."""
    cfg = attrs.evolve(OutboxRelayConfig(), batch_size=4)
    ledger = CycleLedger.for_config(cfg)
    ledger.claimed([row(i) for i in range(7)])
    assert ledger.in_hand.has_room()
    ledger.claimed([row(8)])
    assert not ledger.in_hand.has_room()
    assert ledger.in_hand.max_bytes == cfg.claim_max_bytes


@pytest.mark.parametrize("published", [0, 5])
def test_the_ledger_keeps_the_counts_it_was_given(published: int) -> None:
    counts = RelayCounts(published=published)
    assert CycleLedger.for_config(OutboxRelayConfig(), counts).counts is counts
