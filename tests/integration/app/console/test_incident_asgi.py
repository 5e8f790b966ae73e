"""Incident-scoped actions over ASGI against a real database: a filter's preview (count
and sample, nothing changed), the act on exactly the previewed snapshot page by page, each
row re-checked, and one trail row per page naming the incident and the filter."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import httpx
import psycopg
import pytest

from supervision.app import incidents
from supervision.app.console import snapshots
from tests.integration.app.console.support import console_config, dead_letter, quarantine
from tests.integration.app.console.test_console_asgi import client_for, form_token, post
from tests.integration.app.test_runbook import remember_poison
from tests.messenger import attempt, insert_conference


@pytest.fixture
async def writable(db_dsn: str) -> AsyncIterator[httpx.AsyncClient]:
    async for client in client_for(console_config(db_dsn, allow_actions=True)):
        yield client


def snapshot_of(html: str) -> str:
    match = re.search(r'name="snapshot" value="([A-Za-z0-9_-]+)"', html)
    assert match, "no snapshot in the page"
    return match.group(1)


def trail(db_dsn: str) -> list[tuple[object, ...]]:
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        return conn.execute("SELECT verb, ids, reason, result FROM safetynet.operator_actions"
                            " ORDER BY id").fetchall()


async def preview(client: httpx.AsyncClient, **fields: str) -> httpx.Response:
    token = await form_token(client, "/incident")
    return await post(client, "/incident/preview", {"token": token, **fields})


async def test_requeue_preview_shows_count_and_sample_and_changes_nothing(
        db_dsn: str, writable: httpx.AsyncClient) -> None:
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        hit = [quarantine(conn, "s3:http_503 <b>slow</b>") for _ in range(3)]
        miss, _ = quarantine(conn, "ffmpeg: bad header")
    page = await preview(writable, verb="requeue", incident="INC-7", status="Quarantined",
                         since="1h", error="http_503")
    assert page.status_code == 200, page.text
    assert "<strong>3</strong> row(s)" in page.text
    assert all(a in page.text for a, _ in hit) and miss not in page.text
    assert "s3:http_503 &lt;b&gt;slow&lt;/b&gt;" in page.text  # escaped
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        assert all(attempt(conn, rec)["status"] == "Quarantined" for _, rec in hit)
    assert trail(db_dsn) == []


async def test_act_touches_exactly_the_previewed_rows_and_names_the_skipped(
        db_dsn: str, writable: httpx.AsyncClient) -> None:
    """A row quarantined after the preview is untouched though it matches; a previewed row
    that moved on is skipped and named; the trail row names the incident and the filter."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        seen, seen_rec = quarantine(conn, "s3:http_503")
        moved, _ = quarantine(conn, "s3:http_503")
    page = await preview(writable, verb="requeue", incident="INC-8", status="Quarantined",
                         error="http_503")
    snap = snapshot_of(page.text)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("UPDATE messenger.recording_finalize_attempts SET status = 'Done'"
                     " WHERE id = %s", (moved,))
        _, later_rec = quarantine(conn, "s3:http_503")
    data = {"token": await form_token(writable), "snapshot": snap, "page": "1"}
    no_reason = await post(writable, "/incident/act", {**data, "confirm": "yes"})
    assert no_reason.status_code == 400 and "reason: required" in no_reason.text
    done = await post(writable, "/incident/act", {**data, "confirm": "yes",
                                                  "reason": "bucket policy fixed"})
    assert done.status_code == 200, done.text
    assert "1 changed" in done.text and f"<code>{moved}</code>" in done.text
    assert 'id="finished"' in done.text
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        assert attempt(conn, seen_rec)["status"] == "Pending"
        assert attempt(conn, later_rec)["status"] == "Quarantined"
    ((verb, ids, reason, result),) = trail(db_dsn)
    assert (verb, ids, reason) == ("requeue", [seen], "bucket policy fixed")
    assert result["incident"] == "INC-8" and result["skipped"] == [moved]
    assert result["filter"] == {"verb": "requeue", "status": "Quarantined",
                                "error": "http_503"}
    assert (result["page"], result["pages"], result["total"]) == (1, 1, 2)
    again = await post(writable, "/incident/act", {**data, "confirm": "yes",
                                                   "reason": "twice"})
    assert again.status_code == 409 and len(trail(db_dsn)) == 1
    past = await post(writable, "/incident/act", {**data, "page": "2", "confirm": "yes",
                                                  "reason": "past the end"})
    assert past.status_code == 409 and "every page" in past.text
    assert len(trail(db_dsn)) == 1


async def test_a_large_incident_is_worked_through_page_by_page(
        db_dsn: str, writable: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the per-request cap the snapshot is acted on a page at a time, in order, one
    trail row per page; a page pressed too soon after the last is refused (429)."""
    monkeypatch.setattr(incidents, "PAGE_SIZE", 2)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        letters = [dead_letter(conn, "kafka:MESSAGE_TOO_LARGE", key=f"order-{i}")
                   for i in range(5)]
        other = dead_letter(conn, "kafka:MESSAGE_TOO_LARGE", key="invoice-1")
    page = await preview(writable, verb="replay", incident="INC-9", topic="t",
                         key_prefix="order-", error="too_large")
    assert "<strong>5</strong> row(s)" in page.text and "page 1 of 3" in page.text
    snap = snapshot_of(page.text)
    data = {"token": await form_token(writable), "snapshot": snap, "confirm": "yes"}
    skip = await post(writable, "/incident/act", {**data, "page": "2", "reason": "r"})
    assert skip.status_code == 409
    first = await post(writable, "/incident/act", {**data, "page": "1",
                                                   "reason": "broker limit raised"})
    assert first.status_code == 200 and 'id="next-page"' in first.text
    fast = await post(writable, "/incident/act", {**data, "page": "2"})
    assert fast.status_code == 429 and fast.headers["retry-after"] == "1"
    monkeypatch.setattr(snapshots, "MIN_PAGE_INTERVAL_S", 0.0)
    for number in (2, 3):  # the reason is the snapshot's from its first page
        response = await post(writable, "/incident/act", {**data, "page": str(number)})
        assert response.status_code == 200, response.text
    assert 'id="finished"' in response.text
    rows = trail(db_dsn)
    assert [r[3]["page"] for r in rows] == [1, 2, 3]
    assert all(r[2] == "broker limit raised" and r[3]["incident"] == "INC-9"
               for r in rows)
    assert sorted(int(i) for r in rows for i in r[1]) == letters
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        dead = [r[0] for r in conn.execute("SELECT outbox_id FROM"
                                           " safetynet.outbox_dead_letters")]
    assert dead == [other]


async def test_release_by_a_filter_releases_the_previewed_poison_conferences(
        db_dsn: str, writable: httpx.AsyncClient) -> None:
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        hit = insert_conference(conn, last_activity_ago=120, started_ago=-3600)
        miss = insert_conference(conn, last_activity_ago=120, started_ago=-3600)
        remember_poison(conn, hit.id, "DataError: video/[/x]")
        remember_poison(conn, miss.id, "timeout")
    page = await preview(writable, verb="release", incident="INC-10", error="DataError*x")
    assert "<strong>1</strong> row(s)" in page.text and hit.id in page.text
    data = {"token": await form_token(writable), "snapshot": snapshot_of(page.text),
            "page": "1", "confirm": "yes", "reason": "row fixed"}
    assert (await post(writable, "/incident/act", data)).status_code == 200
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        left = [str(r[0]) for r in conn.execute("SELECT conference_id FROM"
                                                " safetynet.conference_poison")]
    assert left == [miss.id]
    ((verb, ids, _, result),) = trail(db_dsn)
    assert (verb, ids, result["incident"]) == ("release", [hit.id], "INC-10")


@pytest.mark.parametrize(("fields", "named"), [
    ({"verb": "requeue", "incident": "I", "status": "Done"}, "status"),
    ({"verb": "requeue", "incident": "I", "status": "Quarantined", "since": "2 hours"},
     "since"),
    ({"verb": "requeue", "incident": "I", "status": "Quarantined", "since": "1000000d"},
     "since"),
    ({"verb": "requeue", "incident": "I", "status": "Quarantined", "since": "1h",
      "until": "2h"}, "until"),
    ({"verb": "requeue", "incident": "I", "status": "Quarantined", "topic": "t"}, "topic"),
    ({"verb": "requeue", "incident": "", "status": "Quarantined"}, "incident"),
    ({"verb": "replay", "incident": "I", "key_prefix": "a\x00b"}, "key_prefix"),
    ({"verb": "purge", "incident": "I"}, "verb"),
])
async def test_a_bad_filter_shows_the_form_again_naming_the_field(
        db_dsn: str, writable: httpx.AsyncClient, fields: dict[str, str], named: str
        ) -> None:
    response = await preview(writable, **fields)
    assert response.status_code == 400, response.text
    assert f'id="error">{named}: ' in response.text and 'id="preview"' in response.text
    assert trail(db_dsn) == []


async def test_an_unknown_or_foreign_snapshot_is_refused(
        writable: httpx.AsyncClient) -> None:
    data = {"token": await form_token(writable), "page": "1", "confirm": "yes",
            "reason": "r"}
    bad = await post(writable, "/incident/act", {**data, "snapshot": "x"})
    assert bad.status_code == 400 and "snapshot:" in bad.text
    gone = await post(writable, "/incident/act", {**data, "snapshot": "A" * 24})
    assert gone.status_code == 410 and "preview again" in gone.text


async def test_an_unknown_verb_in_the_filter_link_shows_the_form_with_the_error(
        writable: httpx.AsyncClient) -> None:
    response = await writable.get("/incident?verb=purge")
    assert response.status_code == 400 and 'id="error">verb: ' in response.text


async def test_a_read_only_console_offers_no_incident_action_and_refuses_the_preview(
        db_dsn: str) -> None:
    async for client in client_for(console_config(db_dsn)):
        page = await client.get("/incident?verb=replay")
        assert page.status_code == 200 and "read-only" in page.text
        assert 'id="preview"' not in page.text
        refused = await post(client, "/incident/preview", {
            "token": await form_token(client, "/audit"), "verb": "replay",
            "incident": "I"})
        assert refused.status_code == 403 and "read-only" in refused.text
    assert trail(db_dsn) == []
