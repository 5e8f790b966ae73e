"""The positive canary's verdict from the answers for recordings known to exist."""

from __future__ import annotations

from typing import Any

import pytest

from actors.finalize.canary import check_known_present
from actors.s3.objectstore import Fault, Found, HeadOutcome, Missing, Poison, Transient

FOUND = Found("call-recordings/a", 1, "Ogg", 1)


class KnownRecordings:
    """Stands in for the database: answers the candidate query with fixed ids."""

    def __init__(self, ids: list[str]) -> None:
        self.ids = ids

    async def run(self, fn: Any, limit: int) -> list[str]:
        return self.ids[:limit]


class Answers:
    """An object store whose HEADs answer from a table, recording what was asked."""

    def __init__(self, answers: dict[str, HeadOutcome]) -> None:
        self.answers = answers
        self.asked: list[str] = []

    async def head_recording(self, recording_id: str) -> HeadOutcome:
        self.asked.append(recording_id)
        return self.answers[recording_id]


async def verdict(answers: dict[str, HeadOutcome]) -> tuple[object, list[str]]:
    store = Answers(answers)
    result = await check_known_present(KnownRecordings(list(answers)), store)  # type: ignore[arg-type]
    return result, store.asked


async def test_no_available_recording_yet_is_no_answer_either_way() -> None:
    """Nothing to compare with: None, not a fault and not evidence (the cycle looks for
    evidence elsewhere)."""
    assert await verdict({}) == (None, [])


@pytest.mark.parametrize("present", [FOUND, Poison("duration_missing")])
async def test_one_known_recording_found_is_evidence(present: HeadOutcome) -> None:
    """One binary deleted on purpose does not stop the job: the next one is found
    (with good metadata or not, it exists), it is the answer, and no further HEAD is made."""
    result, asked = await verdict({"a": Missing(), "b": present, "c": Missing()})
    assert isinstance(result, Found) and asked == ["a", "b"]


async def test_every_known_recording_missing_is_a_configuration_fault() -> None:
    """All 404: the configuration points where the binaries are not."""
    result, asked = await verdict({"a": Missing(), "b": Missing(), "c": Missing()})
    assert result == Fault("known_recording_not_found:a") and asked == ["a", "b", "c"]


async def test_missing_and_transient_cannot_tell_so_it_is_transient() -> None:
    """Some 404s and a 503: not proof of a fault, not proof of health — the breaker."""
    result, _ = await verdict({"a": Missing(), "b": Transient("http_503"), "c": Missing()})
    assert result == Transient("http_503")


async def test_a_fault_on_a_known_recording_is_that_fault() -> None:
    """403 / NoSuchBucket on the way: the configuration fault it names, at once."""
    result, asked = await verdict({"a": Fault("bucket_missing"), "b": FOUND})
    assert result == Fault("bucket_missing") and asked == ["a"]
