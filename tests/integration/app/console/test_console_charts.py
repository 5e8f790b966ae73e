"""The console's charts over ASGI (issue 38, item 1): the overview and each job's page draw
the per-minute rollup as inline SVG with its numbers as text, for the last hour or 24 h."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import httpx
import psycopg
import pytest

from tests.integration.app.console.support import console_config
from tests.integration.app.console.test_console_asgi import client_for


def seed_minutes(dsn: str) -> None:
    """Finalize verdicts 3 and 2 minutes ago, a relay minute with a latency, and a
    reaper restart 3 hours ago (in the 24 h charts only)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("""
            INSERT INTO safetynet.job_minutes (job, minute, cycles, reconciled, quarantined,
                republished, withheld, published, stale_timeout, backlog, oldest_age_s,
                ack_ms_max, ack_ms_buckets, restarts, lease_changes)
            VALUES
            ('recording-finalize', date_trunc('minute', now()) - interval '3 min', 4,
             7, 2, 0, 0, 0, 0, 40, 120, 0, DEFAULT, 1, 1),
            ('recording-finalize', date_trunc('minute', now()) - interval '2 min', 4,
             0, 0, 5, 3, 0, 0, 12, 60, 0, DEFAULT, 0, 0),
            ('outbox-relay', date_trunc('minute', now()) - interval '2 min', 9,
             0, 0, 0, 0, 5, 0, 2, 1.5, 700, '{0,0,4,0,1,0,0,0,0,0}', 0, 0),
            ('conference-reaper', date_trunc('minute', now()) - interval '3 hours', 1,
             0, 0, 0, 0, 0, 4, 0, NULL, 0, DEFAULT, 1, 0)""")


@pytest.fixture
async def client(db_dsn: str) -> AsyncIterator[httpx.AsyncClient]:
    seed_minutes(db_dsn)
    async for c in client_for(console_config(db_dsn)):
        yield c


def figure(html: str, chart: str) -> str:
    match = re.search(rf'<figure class="chart" id="chart-{chart}">.*?</figure>', html, re.S)
    assert match, f"no chart {chart}"
    return match.group(0)


async def test_overview_draws_the_last_hour_with_its_numbers(
        client: httpx.AsyncClient) -> None:
    page = await client.get("/")
    assert page.status_code == 200
    verdicts = figure(page.text, "verdicts")
    assert "<svg" in verdicts and "<script" not in page.text
    assert 'aria-label="Verdicts per minute: reconciled 7, republished 5, quarantined 2, ' \
           'withheld 3 rows in all"' in verdicts
    assert verdicts.count('<g class="slot">') == 60
    assert re.search(r"<title>\d\d:\d\d UTC: reconciled 7, republished 0, failed 0, "
                     r"quarantined 2, withheld 0, config_fault 0, ", verdicts)
    assert "latest 12, peak 40" in figure(page.text, "backlog")
    latency = figure(page.text, "relay-latency")
    assert "largest: latest 700" in latency and "p99 (bucket bound): latest 700" in latency
    assert "restarts 1, lease changes 1 events in all" in figure(page.text, "keepers")
    assert "stale_timeout (reaper): 0" in verdicts  # 3 hours ago: not in this hour


async def test_the_24h_span_holds_what_the_hour_leaves_out(client: httpx.AsyncClient
                                                           ) -> None:
    page = await client.get("/jobs/conference-reaper?span=24h")
    assert page.status_code == 200
    verdicts = figure(page.text, "verdicts")
    assert "Verdicts per 10 minutes" in verdicts
    assert verdicts.count('<g class="slot">') == 144
    assert "stale_timeout 4" in verdicts
    hour = await client.get("/jobs/conference-reaper")
    assert "no data in this window" in figure(hour.text, "verdicts")


async def test_a_job_page_shows_only_its_job(client: httpx.AsyncClient) -> None:
    page = await client.get("/jobs/outbox-relay")
    assert page.status_code == 200
    assert 'id="chart-relay-rate"' not in page.text  # its verdicts are its rate
    assert "published 5 rows in all" in figure(page.text, "verdicts")
    assert "reconciled" not in page.text
    overview = await client.get("/")
    assert 'href="/jobs/outbox-relay"' in overview.text


async def test_unknown_job_or_span_is_a_clear_answer(client: httpx.AsyncClient) -> None:
    assert (await client.get("/jobs/nope")).status_code == 404
    bad = await client.get("/?span=2h")
    assert bad.status_code == 400 and "span" in bad.text and "1h, 24h" in bad.text
