"""One relay cycle as the table source's actors see it: a frozen context, and the one
mutable ledger they share.

>>> cycle = RelayCycle(db, cfg, producer, state, deadline, max_row_bytes,
...                    CycleLedger.for_config(cfg))
>>> nursery.start_soon(run_claimer, cycle, claims_send)

:class:`RelayCycle` is built once per cycle by :func:`actors.outbox.relay.run_relay_cycle`
(its database fenced under the lease's term) and handed to the claimer, the publisher,
the marker and the dead letters, each of which also gets its own channel ends. It is
frozen; two of its parts are mutable, each with one owner:

* ``state`` (:class:`~actors.outbox.state.RelayState`): the relay's memory between
  cycles. Within a cycle only the publisher writes it; the claimer reads the topics held
  by a configuration fault, to leave them out of its claims.
* ``ledger`` (:class:`CycleLedger`): what the cycle has in flight. Each of its parts has
  one writer per direction, named on the field. One Trio thread: no locks.

Everything else the actors tell each other goes through their channels.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import attrs
import trio

from actors.kafka.producer import KafkaProducer
from actors.outbox.rows import Malformed, Row
from actors.outbox.settings import OutboxRelayConfig
from actors.outbox.state import RelayCounts, RelayState
from actors.outbox.window import InHand
from supervision.db.database import Database


@attrs.define
class CycleLedger:
    """What one cycle has in flight, shared by its actors (one Trio thread)."""

    # sendable rows claimed and not sent yet: the claimer adds, the publisher's window
    # takes off what leaves it (the claimer waits for room before each claim)
    in_hand: InHand
    # ids claimed in this cycle and not marked: the claimer adds (and skips them when it
    # starts from the beginning again), the marker takes out what it marked
    unmarked: set[int] = attrs.field(factory=set)
    # the cycle's counts: the marker and the dead letters add to them
    counts: RelayCounts = attrs.field(factory=RelayCounts)

    @classmethod
    def for_config(cls, cfg: OutboxRelayConfig,
                   counts: RelayCounts | None = None) -> CycleLedger:
        """About two claims in hand (issue #26): ``2 x batch_size`` rows, at most
        ``claim_max_bytes`` of payloads."""
        return cls(InHand(max_rows=2 * cfg.batch_size, max_bytes=cfg.claim_max_bytes),
                   counts=counts if counts is not None else RelayCounts())

    def claimed(self, rows: Sequence[Row | Malformed]) -> None:
        """The claimer took *rows*: unmarked until the marker says so; the sendable ones
        are in hand."""
        self.unmarked.update(row.id for row in rows)
        self.in_hand.add([row for row in rows if isinstance(row, Row)])

    def marked(self, ids: Iterable[int]) -> None:
        """The marker recorded *ids* published: later claims need not skip them."""
        self.unmarked.difference_update(ids)

    def skip(self) -> list[int]:
        """The ids a claim from the beginning leaves out (claimed, not marked)."""
        return sorted(self.unmarked)


@attrs.frozen
class RelayCycle:
    """One table-source cycle, as its actors see it (see the module's docstring)."""

    db: Database  # fenced under the cycle's lease term when it runs under a lock keeper
    cfg: OutboxRelayConfig
    producer: KafkaProducer
    state: RelayState  # written by the publisher only
    deadline: float  # trio.current_time() + max_run_duration: nothing starts after it
    max_row_bytes: int  # a larger row is dead-lettered unread
    ledger: CycleLedger

    @property
    def counts(self) -> RelayCounts:
        return self.ledger.counts

    @property
    def min_wave(self) -> int:
        """Behind a backlog, a wave of fewer keys waits a little for the claim in flight."""
        return self.cfg.batch_size // 4

    @property
    def past_deadline(self) -> bool:
        return trio.current_time() >= self.deadline
