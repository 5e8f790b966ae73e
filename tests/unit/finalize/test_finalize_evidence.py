"""Evidence before verdicts (issue #25): the verdict gate's holding and releasing, the
evidence a cycle starts with, and how a ListObjectsV2 answer is read."""

from __future__ import annotations

import datetime as dt
from typing import Any

import attrs
import pytest

from actors.finalize.evidence import (
    Acceptance,
    Evidence,
    VerdictGate,
    gather_evidence,
)
from actors.finalize.messages import ClaimedRow, NotAttempted, RowOutcome, Withheld
from actors.s3.objectstore import (
    Fault,
    Found,
    HeadOutcome,
    Missing,
    Poison,
    Transient,
    classify_listing,
)

FOUND = Found("call-recordings/x", 64, "Ogg", 42)
OCTET = Poison("content_type_unknown:application/octet-stream")
PREFIX = "call-recordings/"
RID = "0f8e1c52-6c39-4a55-9d0e-3f4b0c7d2a11"


def row(n: int) -> ClaimedRow:
    return ClaimedRow(attempt_id=f"a{n}", recording_id=f"r{n}", session_kind="Direct",
                      session_id="s", attempts=1, phase="reconcile", recording_status="Uploading",
                      old_attempts=0, old_next_attempt_at=dt.datetime(2026, 1, 1, tzinfo=dt.UTC))


def judged(gate: VerdictGate, heads: list[HeadOutcome]) -> list[tuple[str, object]]:
    """Feed the HEAD outcomes in order, then close; what reached the committers, in order."""
    sent: list[RowOutcome] = []
    for n, head in enumerate(heads):
        sent += gate.judge(row(n), head)
    sent += gate.close(breaker_open=False)
    return [(o.row.recording_id, o.decision) for o in sent]


def test_with_evidence_every_missing_verdict_goes_straight_on_uncapped() -> None:
    """Known evidence at the start: 5,000 Missing outcomes are 5,000 verdicts, none held."""
    gate = VerdictGate(evidence=Evidence.KNOWN_RECORDING_FOUND)
    out = judged(gate, [Missing()] * 5000)
    assert [d for _, d in out] == [Missing()] * 5000 and gate.withheld == 0


def test_without_evidence_missing_outcomes_are_withheld_at_the_end() -> None:
    """No evidence at all: every Missing is held and given back as Withheld when the cycle
    closes; the gate says how many."""
    gate = VerdictGate()
    assert gate.judge(row(0), Missing()) == []
    out = judged(gate, [Missing()] * 3)
    assert [d for _, d in out] == [Withheld("no_evidence_for_key_prefix")] * 4
    assert gate.withheld == 4


def test_a_found_object_releases_the_held_missing_verdicts_and_later_ones_pass() -> None:
    """The first object found is the evidence: the held Missing rows go on right behind
    it, and a later Missing is not held at all; nothing is withheld."""
    gate = VerdictGate()
    out = judged(gate, [Missing(), Missing(), FOUND, Missing()])
    assert out == [("r2", FOUND), ("r0", Missing()), ("r1", Missing()), ("r3", Missing())]
    assert gate.evidence is Evidence.OBJECT_FOUND and gate.withheld == 0


def test_found_rows_are_never_held_while_missing_ones_wait() -> None:
    """A found row is sent the moment its HEAD answers, whatever is held."""
    gate = VerdictGate()
    gate.judge(row(0), Missing())
    assert gate.judge(row(1), FOUND)[0] == RowOutcome(row(1), FOUND)


def test_an_unreadable_response_is_no_evidence() -> None:
    """A response the worker could not read does not prove where objects are."""
    gate = VerdictGate()
    out = judged(gate, [Poison("response_unreadable:malformed_response"), Missing()])
    assert out[-1] == ("r1", Withheld("no_evidence_for_key_prefix"))


def test_when_the_breaker_opened_held_missing_rows_are_deferred_not_withheld() -> None:
    """A store that stopped answering well cannot be judged: the held rows (404s and
    unusable types alike) are given back as never attempted, and no fault is counted."""
    for heads in ([Missing()], [OCTET, OCTET, OCTET]):
        gate = VerdictGate()
        for n, head in enumerate(heads):
            assert gate.judge(row(n), head) == []
        assert gate.close(breaker_open=True) == [
            RowOutcome(row(n), NotAttempted("s3_breaker_open")) for n in range(len(heads))]
        assert (gate.withheld, gate.types_fault) == (0, None)


def test_every_found_object_octet_stream_is_a_configuration_fault() -> None:
    """Three or more objects, none with a usable Content-Type: each row is given back as
    a configuration fault (nothing quarantined); the objects still prove the key mapping,
    so a Missing one gets its verdict."""
    gate = VerdictGate()
    out = judged(gate, [OCTET, OCTET, Missing(), OCTET])
    fault = Fault("content_type_unusable:application/octet-stream")
    assert out == [("r2", Missing()), ("r0", fault), ("r1", fault), ("r3", fault)]
    assert gate.types_fault == "content_type_unusable:application/octet-stream"


def test_one_odd_content_type_among_usable_objects_stays_poison() -> None:
    """A usable object in the cycle (before or after) makes an odd one per-row poison."""
    for heads in ([OCTET, FOUND], [FOUND, OCTET]):
        gate = VerdictGate()
        out = judged(gate, heads)
        assert ("r0" if heads[0] is OCTET else "r1", OCTET) in out
        assert gate.types_fault is None


def test_fewer_than_a_few_odd_objects_alone_stay_poison() -> None:
    """Two objects without a usable Content-Type and nothing else: too few to call the
    store misconfigured; each is quarantined as before."""
    gate = VerdictGate()
    assert judged(gate, [OCTET, Poison("content_type_missing")]) == [
        ("r0", OCTET), ("r1", Poison("content_type_missing"))]
    assert gate.types_fault is None


def test_a_duration_poison_proves_the_content_type_usable() -> None:
    """An object whose only problem is its duration had a usable Content-Type: the
    octet-stream ones of the cycle are poison, not a configuration fault."""
    gate = VerdictGate()
    out = judged(gate, [OCTET, OCTET, OCTET, Poison("duration_missing")])
    assert [d for _, d in out].count(OCTET) == 3 and gate.types_fault is None


class Db:
    """Stands in for the database: the canary's candidates and an acceptance row."""

    def __init__(self, known: list[str], accepted: Acceptance | None = None) -> None:
        self.known, self.accepted = known, accepted

    async def run(self, fn: Any, *args: Any) -> Any:
        return self.known if fn.__name__ == "known_present" else self.accepted


class Store:
    def __init__(self, heads: dict[str, HeadOutcome], listing: Any) -> None:
        self.heads, self.listing, self.listed = heads, listing, 0

    async def head_recording(self, recording_id: str) -> HeadOutcome:
        return self.heads[recording_id]

    async def list_recordings(self) -> Any:
        self.listed += 1
        return self.listing


async def start(known: list[str], heads: dict[str, HeadOutcome], listing: Any,
                accepted: Acceptance | None = None) -> tuple[object, int]:
    store = Store(heads, listing)
    result = await gather_evidence(Db(known, accepted), store, "b",  # type: ignore[arg-type]
                                   PREFIX)
    return result, store.listed


async def test_a_known_recording_found_is_evidence_without_listing() -> None:
    """The positive canary's find is enough: no listing is asked for."""
    assert await start(["k"], {"k": FOUND}, Missing()) == (
        Evidence.KNOWN_RECORDING_FOUND, 0)


async def test_a_fresh_install_finds_its_evidence_in_the_listing() -> None:
    """No Done row yet: a recording-named key under the prefix is the evidence."""
    assert await start([], {}, Found(PREFIX + RID, 0, "", 0)) == (
        Evidence.RECORDINGS_LISTED, 1)


@pytest.mark.parametrize("listing", [Missing(), Fault("access_denied_http_403"),
                                     Transient("http_503")])
async def test_no_listing_evidence_falls_back_to_an_operator_acceptance(listing: Any) -> None:
    """An empty, refused or failed listing is no evidence; an acceptance in force is, and
    without one there is none."""
    accepted = Acceptance(dt.datetime(2026, 1, 1, tzinfo=dt.UTC), "ops@h", "INC-1")
    assert await start([], {}, listing, accepted) == (Evidence.OPERATOR_ACCEPTED, 1)
    assert await start([], {}, listing) == (None, 1)


async def test_every_known_recording_missing_is_still_the_canary_fault() -> None:
    """The positive canary's configuration fault stands before any other evidence."""
    result, listed = await start(["k"], {"k": Missing()}, Found(PREFIX + RID, 0, "", 0))
    assert result == Fault("known_recording_not_found:k") and listed == 0


def listing(*keys: str, root: str = "ListBucketResult") -> bytes:
    contents = "".join(f"<Contents><Key>{k}</Key><Size>64</Size></Contents>" for k in keys)
    return (f'<?xml version="1.0" encoding="UTF-8"?><{root} '
            f'xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Name>b</Name>'
            f"<Prefix>{PREFIX}</Prefix>{contents}</{root}>").encode()


def test_a_listing_with_a_recording_named_key_is_found() -> None:
    """Keys that are not recordings (a readme, the probe key) are passed over."""
    body = listing(PREFIX + "README", PREFIX + "__safetynet_probe__", PREFIX + RID)
    assert classify_listing(PREFIX, 200, {}, body) == Found(PREFIX + RID, 0, "", 0)


@pytest.mark.parametrize("keys", [(), (PREFIX + "README",), (PREFIX + RID + ".part",),
                                  ("other/" + RID,)])
def test_a_listing_without_a_recording_named_key_is_missing(keys: tuple[str, ...]) -> None:
    """Empty, or only keys that no recording would have: no evidence."""
    assert classify_listing(PREFIX, 200, {}, listing(*keys)) == Missing()


@pytest.mark.parametrize(("status", "body", "expected"), [
    (403, b"<Error><Code>AccessDenied</Code></Error>", Fault("access_denied_http_403")),
    (404, b"<Error><Code>NoSuchBucket</Code></Error>", Fault("bucket_missing")),
    (503, b"", Transient("http_503")),
    (200, b"<html>not a listing", Transient("list_unreadable")),
    (200, listing(PREFIX + RID, root="Error"), Transient("list_unreadable")),
])
def test_a_listing_that_is_no_listing_says_why(status: int, body: bytes,
                                               expected: object) -> None:
    """Refused, missing bucket, unavailable, or a body that is not a listing: never
    evidence, never an exception."""
    assert classify_listing(PREFIX, status, {}, body) == expected


def in_batch(n: int, batch: int) -> ClaimedRow:
    return attrs.evolve(row(n), batch=batch)


def test_a_batch_is_judged_when_its_last_head_is_in_and_holds_nothing_after() -> None:
    """Claim batches of 2: batch 0's 404s are withheld the moment its second HEAD
    answers, before a later batch's found object; that object gives its own batch the
    evidence. Nothing stays held once a batch is closed."""
    gate = VerdictGate()
    assert gate.open_batch(0, 2) == [] and gate.open_batch(1, 2) == []
    assert gate.judge(in_batch(0, 0), Missing()) == []
    assert gate.held == 1
    withheld = Withheld("no_evidence_for_key_prefix")
    assert gate.judge(in_batch(1, 0), Missing()) == [
        RowOutcome(in_batch(0, 0), withheld), RowOutcome(in_batch(1, 0), withheld)]
    assert (gate.held, gate.withheld) == (0, 2)
    assert gate.judge(in_batch(2, 1), Missing()) == []
    assert gate.judge(in_batch(3, 1), FOUND) == [
        RowOutcome(in_batch(3, 1), FOUND), RowOutcome(in_batch(2, 1), Missing())]
    assert gate.held == 0 and gate.close(breaker_open=False) == []


def test_a_later_batch_found_first_does_not_judge_an_earlier_one() -> None:
    """Concurrent HEADs answer out of order: an object found in batch 1 before batch 0's
    last HEAD is in still gives batch 0 no evidence — what the run decides does not depend
    on that order, and batch 1 waits for batch 0 to close first."""
    gate = VerdictGate()
    gate.open_batch(0, 2)
    gate.open_batch(1, 1)
    assert gate.judge(in_batch(0, 0), Missing()) == []
    assert gate.judge(in_batch(2, 1), FOUND) == [RowOutcome(in_batch(2, 1), FOUND)]
    assert gate.judge(in_batch(1, 0), Missing()) == [
        RowOutcome(in_batch(0, 0), Withheld("no_evidence_for_key_prefix")),
        RowOutcome(in_batch(1, 0), Withheld("no_evidence_for_key_prefix"))]


def test_batches_close_in_claim_order() -> None:
    """Batch 1 complete before batch 0: its held rows wait until batch 0 closes (so that
    whether batch 0 found an object is known), then both close, batch 0 first."""
    gate = VerdictGate()
    gate.open_batch(0, 1)
    gate.open_batch(1, 1)
    assert gate.judge(in_batch(1, 1), Missing()) == []
    assert gate.judge(in_batch(0, 0), FOUND) == [
        RowOutcome(in_batch(0, 0), FOUND), RowOutcome(in_batch(1, 1), Missing())]


def test_an_empty_claim_batch_closes_at_once() -> None:
    """A claim with nothing to HEAD (terminal rows only) does not hold later batches."""
    gate = VerdictGate()
    gate.open_batch(0, 0)
    gate.open_batch(1, 1)
    assert gate.judge(in_batch(0, 1), Missing()) == [
        RowOutcome(in_batch(0, 1), Withheld("no_evidence_for_key_prefix"))]


def test_the_breaker_defers_the_batch_it_opened_in_not_the_closed_ones() -> None:
    """Batch 0 closed (withheld); the breaker opens in batch 1: batch 1's held 404 and its
    rows never HEADed are deferred, not withheld."""
    gate = VerdictGate()
    gate.open_batch(0, 1)
    gate.open_batch(1, 3)
    assert gate.judge(in_batch(0, 0), Missing())[0].decision == Withheld(
        "no_evidence_for_key_prefix")
    gate.judge(in_batch(1, 1), Missing())
    deferred = NotAttempted("s3_breaker_open")
    gate.judge(in_batch(2, 1), Transient("http_503"), breaker_open=True)
    out = gate.judge(in_batch(3, 1), deferred, breaker_open=True)
    assert [(o.row.recording_id, o.decision) for o in out] == [
        ("r3", deferred), ("r1", deferred)]
    assert gate.withheld == 1


def test_unusable_types_are_counted_across_closed_batches() -> None:
    """Two octet-stream objects in batch 0 (too few, no usable one) are poison each; the
    third, in batch 1, makes the cycle's count a configuration fault from then on."""
    gate = VerdictGate()
    gate.open_batch(0, 2)
    gate.open_batch(1, 1)
    assert gate.judge(in_batch(0, 0), OCTET) == []
    assert gate.judge(in_batch(1, 0), OCTET) == [
        RowOutcome(in_batch(0, 0), OCTET), RowOutcome(in_batch(1, 0), OCTET)]
    fault = Fault("content_type_unusable:application/octet-stream")
    assert gate.judge(in_batch(2, 1), OCTET) == [RowOutcome(in_batch(2, 1), fault)]
