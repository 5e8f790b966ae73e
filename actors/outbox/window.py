"""The publisher's window of claimed rows, and the room the claimer waits for.

>>> in_hand = InHand(max_rows=2 * cfg.batch_size, max_bytes=cfg.claim_max_bytes)
>>> await in_hand.room()                       # the claimer, before each claim
>>> letters = window.take(claim)               # the publisher: a claim joins the window
>>> wave = window.next_wave(now, state.rows.due_at)

:class:`InHand` counts the sendable rows claimed and not sent yet, wherever they are (in
the claimer's hand, waiting to be taken, or in the window): the claimer adds a claim's rows
when it has claimed them, the window takes them off when they leave it (sent in a wave,
or dropped with their key or topic). The claimer claims again only while fewer than
``2 x batch_size`` rows and fewer than ``claim_max_bytes`` bytes of payloads are in hand,
so the relay holds about two claims whatever the rows weigh (issue #26), and a wave is
formed from up to two claims' rows, which keeps waves large when keys repeat.

:class:`Window` keeps per-key order: a wave holds at most one row per key, and a key with
a row not acknowledged in this cycle (failed, rejected, malformed, still in its back-off)
is held, so its later rows wait for a later cycle. Rows of a topic the broker refuses us
(a configuration fault) leave the window for the rest of the cycle.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs
import trio

from actors.outbox.messages import Claim, DeadLetter
from actors.outbox.rows import Key, Row, next_wave


def payload_bytes(rows: Sequence[Row]) -> int:
    return sum(len(row.message.value) for row in rows)


@attrs.define
class InHand:
    """Sendable rows claimed and not sent yet: how many, how many payload bytes."""

    max_rows: int
    max_bytes: int
    rows: int = 0
    size: int = 0
    _left: trio.Event = attrs.field(factory=trio.Event)

    def has_room(self) -> bool:
        return self.rows < self.max_rows and self.size < self.max_bytes

    def add(self, rows: Sequence[Row]) -> None:
        self.rows += len(rows)
        self.size += payload_bytes(rows)

    def remove(self, rows: int, size: int) -> None:
        self.rows -= rows
        self.size -= size
        self._left.set()

    async def room(self) -> None:
        """Return once there is room for another claim."""
        while not self.has_room():
            self._left = trio.Event()
            await self._left.wait()


@attrs.define
class Window:
    """The publisher's claimed rows not sent yet (id order), and what it holds back for
    the rest of the cycle: keys (``held``) and topics (``faulted``)."""

    in_hand: InHand
    rows: list[Row] = attrs.field(factory=list)
    size: int = 0
    held: set[Key] = attrs.field(factory=set)
    faulted: set[str] = attrs.field(factory=set)
    seen_ids: set[int] = attrs.field(factory=set)  # every row claimed in this cycle
    seen_topics: set[str] = attrs.field(factory=set)

    def take(self, claim: Claim) -> list[DeadLetter]:
        """Add a claim's sendable rows; its malformed rows hold their key and come back
        as dead letters. Rows of a held key are left out (they wait for a later cycle)."""
        letters: list[DeadLetter] = []
        dropped: list[Row] = []
        for row in claim.rows:
            self.seen_ids.add(row.id)
            self.seen_topics.add(row.topic)
            key = (row.topic, row.message_key)
            if key in self.held:
                if isinstance(row, Row):
                    dropped.append(row)
            elif isinstance(row, Row):
                self.rows.append(row)
                self.size += len(row.message.value)
            else:
                self.held.add(key)
                letters.append(DeadLetter(row.id, row.topic, row.message_key, row.reason))
        if dropped:
            self.in_hand.remove(len(dropped), payload_bytes(dropped))
        return letters

    def hold(self, row: Row) -> None:
        """The row was not acknowledged: every later row of its key waits."""
        self.held.add((row.topic, row.message_key))

    def fault(self, topic: str) -> bool:
        """The broker refuses us for *topic*: its rows leave the window. True the first
        time in this cycle."""
        if topic in self.faulted:
            return False
        self.faulted.add(topic)
        return True

    def keys_fewer_than(self, n: int) -> bool:
        """True when the rows waiting are of fewer than *n* sendable keys (the next wave
        would be smaller than *n* rows)."""
        keys: set[Key] = set()
        for row in self.rows:
            if row.topic not in self.faulted:
                key = (row.topic, row.message_key)
                if key not in self.held:
                    keys.add(key)
                    if len(keys) >= n:
                        return False
        return True

    def next_wave(self, now: float, due_at: Callable[[int], float]) -> list[Row]:
        """The next wave (at most one row per key; see :func:`actors.outbox.rows.next_wave`);
        the rows that left the window leave the claimer room."""
        rows = self.rows
        if self.faulted:
            rows = [row for row in rows if row.topic not in self.faulted]
        wave, rest = next_wave(rows, self.held, now, due_at)
        size = payload_bytes(rest) if len(rest) < len(self.rows) else self.size
        if len(rest) < len(self.rows):
            self.in_hand.remove(len(self.rows) - len(rest), self.size - size)
        self.rows, self.size = rest, size
        return wave
