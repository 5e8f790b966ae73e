"""The console's SVG charts (issue 38, item 1): scales, empty series, slots, escaping."""

from __future__ import annotations

import datetime as dt
import re

import pytest

from actors.rollup import OUTCOMES
from supervision.app.console.app import _templates
from supervision.app.console.charts import (
    BOTTOM,
    HEIGHT,
    TOP,
    bar_chart,
    line_chart,
    nice_max,
    number,
)
from supervision.app.console.panels import panels
from supervision.app.console.series import SPANS, Slot, slotted
from supervision.jobs import Job

T0 = dt.datetime(2026, 12, 4, 12, 0, tzinfo=dt.UTC)
STARTS = [T0 + dt.timedelta(minutes=i) for i in range(4)]
JOBS = [str(j) for j in Job]


def render(chart: object) -> str:
    module = _templates.get_template("charts.html").module
    return str(module.chart(chart))  # type: ignore[attr-defined]


@pytest.mark.parametrize(("value", "top"), [
    (0, 1), (1, 1), (3, 5), (7, 10), (10, 10), (11, 20), (0.3, 0.5), (1234, 2000)])
def test_nice_max_is_the_next_one_two_or_five(value: float, top: float) -> None:
    assert nice_max(value) == pytest.approx(top)


def test_stacked_bars_reach_the_slot_total_on_the_scale() -> None:
    """Slot 2 holds 3 + 2 = 5 on a 0..5 scale: its bars fill the plot's height exactly,
    stacked without overlap; slot 0 has none."""
    chart = bar_chart("v", "Verdicts", "rows", STARTS,
                      [("reconciled", [0, 1, 3, 0]), ("failed", [0, 0, 2, None])])
    assert [t.label for t in chart.y_ticks] == ["0", "2.5", "5"]
    col = chart.columns[2]
    assert [b.series for b in col.bars] == [0, 1]
    low, high = col.bars
    assert low.y + low.h == pytest.approx(HEIGHT - BOTTOM)
    assert high.y + high.h == pytest.approx(low.y)
    assert high.y == pytest.approx(TOP)
    assert chart.columns[0].bars == ()
    assert col.label == "12:02 UTC: reconciled 3, failed 2 rows"
    assert chart.summary == "reconciled 4, failed 2 rows in all"
    assert chart.rows == (("12:01 UTC", "1", "0"), ("12:02 UTC", "3", "2"))


def test_an_empty_series_says_so_and_draws_nothing() -> None:
    for chart in (bar_chart("v", "V", "rows", STARTS, [("reconciled", [0, 0, 0, 0])]),
                  line_chart("b", "B", "rows", STARTS, [("x", [None] * 4)])):
        assert chart.empty and chart.rows == ()
        html = render(chart)
        assert "no data in this window" in html
        assert "<polyline" not in html and 'class="s0"' not in html
    assert bar_chart("v", "V", "rows", [], []).empty


def test_a_missing_value_breaks_the_line() -> None:
    chart = line_chart("b", "Backlog", "rows", STARTS, [("rf", [1, 2, None, 4])])
    [line] = chart.lines
    assert len(line.segments) == 2 and line.segments[1].count(",") == 1
    assert len(line.dots) == 3  # the lone last point is drawn as a dot
    assert chart.legend[0].figure == "latest 4"
    assert chart.summary == "rf: latest 4, peak 4 (rows)"


def test_names_and_numbers_are_escaped_in_the_svg() -> None:
    """A series name with markup shows as text in the title, legend and table."""
    evil = "<script>alert(1)</script>"
    html = render(bar_chart("v", "V & <b>", "rows", STARTS, [(evil, [1, 0, 0, 0])]))
    assert "<script>" not in html and "<b>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert re.search(r'<svg viewBox="0 0 \d+ \d+" role="img" aria-label="V &amp; ', html)


def test_number_formats_whole_and_fractional_figures() -> None:
    assert (number(1234), number(2.25), number(None)) == ("1,234", "2.2", "—")


def test_rows_are_summed_into_slots_and_the_span_always_has_every_slot() -> None:
    """24 h in 10-minute slots: two minutes of one slot add up; a row before the span is
    left out; the last slot holds now."""
    now = T0 + dt.timedelta(minutes=25)
    row = {"job": "recording-finalize", "cycles": 1, **dict.fromkeys(OUTCOMES, 0),
           "reconciled": 2, "backlog": 7, "oldest_age_s": 3.0, "ack_ms_max": 0,
           "ack_ms_buckets": [0] * 10, "failed_ticks": 0, "restarts": 0,
           "lease_changes": 0}
    rows = [{**row, "minute": T0 + dt.timedelta(minutes=21)},
            {**row, "minute": T0 + dt.timedelta(minutes=22), "backlog": 9},
            {**row, "minute": T0 - dt.timedelta(days=2)}]
    minutes = slotted(rows, ["recording-finalize"], SPANS["24h"], now)
    assert len(minutes.starts) == 144 and minutes.starts[-1] == T0 + dt.timedelta(minutes=20)
    last = minutes.slots["recording-finalize"][-1]
    assert (last.cycles, last.outcomes["reconciled"], last.backlog) == (2, 4, 9)
    assert sum(s.cycles for s in minutes.slots["recording-finalize"]) == 2


def test_p99_is_the_bound_of_the_bucket_holding_it() -> None:
    slot = Slot(published=100, ack_ms_max=900)
    slot.ack_ms_buckets = [90, 9, 1, 0, 0, 0, 0, 0, 0, 0]
    assert slot.ack_ms_p99() == 100.0
    slot.ack_ms_buckets = [0] * 9 + [100]
    assert slot.ack_ms_p99() == 900.0
    assert Slot().ack_ms_p99() is None


def test_the_overview_and_each_job_get_their_charts() -> None:
    minutes = slotted([], JOBS, SPANS["1h"], T0)
    assert [c.id for c in panels(minutes, JOBS)] == [
        "verdicts", "backlog", "oldest-age", "relay-rate", "relay-latency", "keepers"]
    assert [c.id for c in panels(minutes, [Job.CONFERENCE_REAPER])] == [
        "verdicts", "backlog", "keepers"]
    relay = panels(minutes, [Job.OUTBOX_RELAY])
    assert [c.id for c in relay] == [
        "verdicts", "backlog", "oldest-age", "relay-latency", "keepers"]
    assert relay[0].head == ("time (UTC)", "published", "failed")
    assert panels(minutes, JOBS)[0].head[1:4] == ("reconciled", "republished", "failed")
