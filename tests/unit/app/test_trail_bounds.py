"""The operator trail's bounds (issue 36, item 5): ids parsed as the kind their verb acts
on, what is not an id counted and never kept, lists and strings of a result cut."""

from __future__ import annotations

import json
import uuid

from supervision.app.trail import (
    ID_KINDS,
    MAX_LIST,
    MAX_TEXT,
    RESULT_BUDGET,
    IdKind,
    Verb,
    bounded_result,
    parse_ids,
)


def test_uuids_are_kept_in_their_canonical_form_once_and_the_rest_counted() -> None:
    one = uuid.uuid4()
    given = [str(one).upper(), "{" + str(one) + "}", "x" * 1_000_000, "", "12", str(one)]
    ids = parse_ids(IdKind.UUID, given)
    assert ids.valid == [str(one)]
    assert (ids.rejected, ids.omitted) == (3, 0)
    assert ids.counts() == {"rejected": 3}


def test_bigints_are_decimal_ascii_within_range() -> None:
    ids = parse_ids(IdKind.BIGINT, ["007", "42", "²", "-1", "1e3", str(2**63 - 1),
                                    str(2**63), "1" * 20, " 5"])
    assert ids.valid == ["7", "42", str(2**63 - 1)]
    assert ids.rejected == 6


def test_job_names_and_other_text_are_bounded() -> None:
    assert parse_ids(IdKind.JOB, ["outbox-relay", "Outbox", "a" * 65]).valid == [
        "outbox-relay"]
    text = parse_ids(IdKind.TEXT, ["s3://b/p/", "", "y" * 1401])
    assert (text.valid, text.rejected) == (["s3://b/p/"], 2)


def test_values_that_are_not_strings_are_rejected() -> None:
    assert parse_ids(IdKind.BIGINT, [7, None, b"8"]).rejected == 3


def test_ids_over_the_cap_are_counted_not_kept() -> None:
    given = [str(uuid.uuid4()) for _ in range(12)]
    ids = parse_ids(IdKind.UUID, given, cap=10)
    assert ids.valid == given[:10] and ids.omitted == 2
    assert ids.counts("ids_") == {"ids_omitted": 2}


def test_every_verb_that_names_rows_names_a_uuid_or_a_bigint() -> None:
    assert ID_KINDS[Verb.REQUEUE] is ID_KINDS[Verb.RELEASE] is IdKind.UUID
    assert ID_KINDS[Verb.REPLAY] is ID_KINDS[Verb.PURGE_DEAD_LETTERS] is IdKind.BIGINT
    assert Verb.ACCEPT_MISSING not in ID_KINDS  # a location: bounded text


def test_a_result_keeps_short_lists_and_cuts_long_ones_keeping_their_length() -> None:
    rows = [{"attempt_id": str(i), "last_error": "e" * 5000} for i in range(MAX_LIST + 5)]
    out = bounded_result({"changed": 105, "rows": rows, "skipped": ["a", "b"],
                          "seen_as": "Quarantined"})
    assert out["changed"] == 105 and out["skipped"] == ["a", "b"]
    assert "skipped_total" not in out
    assert len(out["rows"]) == MAX_LIST and out["rows_total"] == MAX_LIST + 5
    assert len(out["rows"][0]["last_error"]) == MAX_TEXT


def test_a_result_too_large_for_its_budget_is_cut_further_until_it_fits() -> None:
    wide = {f"k{i}": ["v" * MAX_TEXT] * MAX_LIST for i in range(MAX_LIST)}
    out = bounded_result(wide)
    assert len(json.dumps(out)) <= RESULT_BUDGET
    assert out["k0_total"] == MAX_LIST and len(out["k0"]) < MAX_LIST


def test_values_json_cannot_hold_become_bounded_text() -> None:
    out = bounded_result({"when": object(), "n": 3, "ok": True, "none": None})
    assert isinstance(out["when"], str) and out["n"] == 3 and out["ok"] is True
    assert out["none"] is None
