"""What the relay's actors pass each other over the cycle's memory channels.

    claimer ──Claim──▶ publisher ──Answered──▶ marker
                           └──────DeadLetter──▶ dead letters

A :class:`Claim` is one claim transaction's rows in id order (sendable :class:`Row` and
:class:`Malformed`); an empty one tells the publisher that the claimer caught up.
:class:`Answered` is what the broker said about a wave's rows that the database must
record (acknowledged: mark published; failed transiently: count the attempt).
:class:`DeadLetter` is a row that can never be published, with its one-line reason.
"""

from __future__ import annotations

import attrs

from actors.outbox.rows import Malformed, Row


@attrs.frozen
class Claim:
    """What one claim took: its rows in id order (up to the byte cap), how many rows it
    locked before the cap (more than ``len(rows)``: the cap cut it, more are waiting),
    when it was made (trio time: the topic faults it left out were those not due by then),
    and whether it was taken behind a backlog (full or cut: the claimer goes on after its
    last id at once)."""

    rows: list[Row | Malformed]
    locked: int
    at: float = 0.0
    behind: bool = False


@attrs.frozen
class Failure:
    """A row the broker did not take this time (a transient failure)."""

    id: int
    topic: str
    error: str


@attrs.frozen
class Answered:
    """A wave's rows to record: acknowledged ids (mark published) and transient failures
    (an attempt counted, ``last_error`` set)."""

    acked: list[int]
    failed: list[Failure]


@attrs.frozen
class DeadLetter:
    """A row that can never be published: malformed, too large, rejected by the broker."""

    id: int
    topic: str
    message_key: str
    reason: str
