"""How many rows one finalize claim takes (``actors.finalize_claimer.claim_size``)."""

from __future__ import annotations

import attrs

from actors.finalize_claimer import claim_size
from actors.s3_reconciler import pool_size
from supervision.config import RecordingFinalizeConfig

CFG = RecordingFinalizeConfig()  # batch_size 100, backoff_base 60 s, jitter 0.2


def test_batch_size_stands_when_it_exceeds_two_reconciler_pools() -> None:
    """At s3.concurrency 8 (a pool of 16) the configured 100 rows per claim stay."""
    assert claim_size(CFG, pool_size(8), 8, s3_timeout=5.0) == 100


def test_a_claim_holds_two_reconciler_pools_at_high_concurrency() -> None:
    """At s3.concurrency 64 (a pool of 128) a claim takes 256 rows, not 100: a claim of
    100 is worked faster than the next claim transaction lasts."""
    assert claim_size(CFG, pool_size(64), 64, s3_timeout=5.0) == 256


def test_claim_ahead_is_bounded_by_what_can_be_worked_before_the_back_off_expires() -> None:
    """With a 10 s back-off (8 s less jitter) and 5 s per HEAD at worst, 64 connections
    work ~102 rows before claimed rows are due again; two claims are in hand at once, so
    a claim takes 51 — never below batch_size, though."""
    short = attrs.evolve(CFG, backoff_base=10.0, batch_size=20)
    assert claim_size(short, pool_size(64), 64, s3_timeout=5.0) == 51
    assert claim_size(attrs.evolve(short, batch_size=80), pool_size(64), 64,
                      s3_timeout=5.0) == 80
