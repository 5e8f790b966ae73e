"""Incident filters parsed strictly (supervision/app/incidents.py, console inputs), the
error pattern as ILIKE, and the console's snapshot store (bounded, bound to its login,
paged, rate-limited)."""

from __future__ import annotations

import datetime as dt

import pytest

from supervision.app import incidents
from supervision.app.console import inputs, snapshots
from supervision.app.console.inputs import BadInput
from supervision.app.incidents import BadFilter, Filter, Preview, like_pattern, parse_filter
from supervision.app.trail import Verb


def test_a_filter_keeps_only_the_fields_given_and_parses_times() -> None:
    f = parse_filter("replay", {"since": "2h", "until": "2999-12-04T10:00", "topic": "t",
                                "key_prefix": "order-", "error": "", "status": None})
    assert f.topic == "t" and f.key_prefix == "order-" and f.error is None
    assert f.until == dt.datetime(2999, 12, 4, 10, tzinfo=dt.UTC)
    assert f.since is not None and f.since.tzinfo is not None
    assert set(f.as_json()) == {"verb", "since", "until", "topic", "key_prefix"}


@pytest.mark.parametrize(("verb", "given", "field"), [
    ("requeue", {"status": ""}, "status"),  # no silent default: the form always sends one
    ("requeue", {"status": "quarantined"}, "status"),
    ("requeue", {"status": "Quarantined", "since": "2 hours ago"}, "since"),
    ("requeue", {"status": "Quarantined", "since": "1000000d"}, "since"),
    ("requeue", {"status": "Quarantined", "until": "tomorrow"}, "until"),
    ("requeue", {"status": "Quarantined", "since": "1h", "until": "3h"}, "until"),
    ("requeue", {"status": "Quarantined", "key_prefix": "a"}, "key_prefix"),
    ("release", {"status": "Pending"}, "status"),
    ("replay", {"error": "x" * 201}, "error"),
    ("replay", {"topic": "a\nb"}, "topic"),
    ("purge", {}, "verb"),
])
def test_a_bad_field_is_refused_by_name(verb: str, given: dict[str, str],
                                        field: str) -> None:
    with pytest.raises(BadFilter) as caught:
        parse_filter(verb, given)
    assert caught.value.field == field and str(caught.value).startswith(f"{field}: ")


def test_the_incident_name_is_required_and_printable() -> None:
    assert incidents.parse_incident(" INC-42 ".strip()) == "INC-42"
    for bad in ("", None, "a\x07b", "x" * 201):
        with pytest.raises(BadFilter, match=r"^incident: "):
            incidents.parse_incident(bad)


def test_console_inputs_turn_a_bad_filter_into_bad_input_naming_the_field() -> None:
    with pytest.raises(BadInput) as caught:
        inputs.incident_filter({"verb": "requeue", "status": "Quarantined",
                                "incident": "I", "since": "soon"})
    assert caught.value.field == "since" and str(caught.value).startswith("since: must")
    for fields, field in (({"snapshot": "x", "page": "1"}, "snapshot"),
                          ({"snapshot": "A" * 24, "page": "²"}, "page"),
                          ({"snapshot": "A" * 24, "page": "0"}, "page")):
        with pytest.raises(BadInput, match=rf"^{field}: "):
            inputs.snapshot_page(fields)


def test_the_error_pattern_is_literal_but_for_the_star() -> None:
    assert like_pattern("http_503*slow") == "%http\\_503%slow%"
    assert like_pattern("100%") == "%100\\%%" and like_pattern("a\\b") == "%a\\\\b%"
    assert like_pattern(None) is None


def preview_of(n: int) -> Preview:
    return Preview(Filter(Verb.REPLAY), [str(i) for i in range(1, n + 1)], [], False, False)


def test_snapshots_are_bound_to_their_login_bounded_and_expire() -> None:
    now = [0.0]
    kept = snapshots.Snapshots(clock=lambda: now[0])
    first = kept.put("ana", preview_of(3), "INC")
    assert kept.get(first.token, "ana") is first and kept.get(first.token, "bob") is None
    for _ in range(snapshots.MAX_SNAPSHOTS):
        kept.put("ana", preview_of(1), "INC")
    assert kept.get(first.token, "ana") is None  # the oldest went first
    last = kept.put("ana", preview_of(1), "INC")
    now[0] += snapshots.TTL_S + 1
    assert kept.get(last.token, "ana") is None


def test_a_snapshot_is_cut_into_pages_and_pages_are_spaced(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(incidents, "PAGE_SIZE", 2)
    now = [100.0]
    kept = snapshots.Snapshots(clock=lambda: now[0])
    snap = kept.put("ana", preview_of(5), "INC")
    assert snap.pages == [["1", "2"], ["3", "4"], ["5"]] and snap.next_page == 1
    assert kept.wait() == 0
    kept.start()
    assert kept.wait() > 0  # one page at a time
    kept.done()
    assert kept.wait() == snapshots.MIN_PAGE_INTERVAL_S
    now[0] += snapshots.MIN_PAGE_INTERVAL_S
    assert kept.wait() == 0
