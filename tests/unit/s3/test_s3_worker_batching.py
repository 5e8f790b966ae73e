"""The S3 worker writes its answers in batches while requests queue behind them."""

from __future__ import annotations

import pytest

from actors.s3.worker import ANSWER_HOLD, answer_hold


def test_answers_go_at_once_when_no_request_waits_for_a_connection() -> None:
    """Nothing queued: the daemon's refills are what the connections wait for."""
    assert answer_hold(held_since=10.0, now=10.0, queued=0) <= 0


def test_answers_wait_for_others_while_requests_are_queued() -> None:
    """With queued requests an answer waits, but never past ANSWER_HOLD."""
    assert answer_hold(held_since=10.0, now=10.0, queued=3) == pytest.approx(ANSWER_HOLD)
    assert answer_hold(held_since=10.0, now=10.0 + ANSWER_HOLD, queued=3) <= 0
