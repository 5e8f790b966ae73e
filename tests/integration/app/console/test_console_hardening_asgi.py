"""The console's hardening over ASGI against a real database (issue #38 item 4): the Host
allow-list and the public origin, the form cap, operator input that does not parse shown
again with its error (never a 500, never a silent default), the bounded payload preview,
and the audit as a rate-limited POST whose last result the page shows."""

from __future__ import annotations

import html
import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import psycopg
import pytest
from psycopg.types.json import Jsonb

from supervision.app.console.audit_runs import AUDIT_MIN_INTERVAL_S
from supervision.app.console.inputs import MAX_FORM_BYTES
from supervision.app.console.security import SESSION_COOKIE
from supervision.app.console.views import PREVIEW_CHARS
from tests.cli import cli, postgres_only_config
from tests.integration.app.console.support import console_config, dead_letter
from tests.integration.app.console.test_console_asgi import client_for, form_token, post, token


@pytest.fixture
async def writable(db_dsn: str) -> AsyncIterator[httpx.AsyncClient]:
    async for client in client_for(console_config(db_dsn, allow_actions=True)):
        yield client


@pytest.fixture
async def read_only(db_dsn: str) -> AsyncIterator[httpx.AsyncClient]:
    async for client in client_for(console_config(db_dsn)):
        yield client


def trail_rows(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        (count,) = conn.execute("SELECT count(*) FROM safetynet.operator_actions"
                                ).fetchone() or (0,)
        return int(count)


def paused(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        (count,) = conn.execute("SELECT count(*) FROM safetynet.job_pauses").fetchone() or (0,)
        return int(count)


async def test_a_host_the_console_does_not_answer_to_is_refused(
        read_only: httpx.AsyncClient) -> None:
    """A DNS-rebinding page reaches the console under its own name: refused before the
    login is even checked."""
    refused = await read_only.get("/", headers={"Host": "evil.test:9470"})
    assert refused.status_code == 400 and "unknown Host" in refused.text
    assert "www-authenticate" not in refused.headers
    assert (await read_only.get("/")).status_code == 200


async def test_posts_from_the_public_origin_behind_a_tls_terminator_are_accepted(
        db_dsn: str) -> None:
    """Behind a TLS terminator the browser's Origin is the public https origin while the
    request arrives as plain http with the upstream Host: with console.public_origin the
    POST acts; another origin is still refused."""
    cfg = console_config(db_dsn, allow_actions=True,
                         public_origin="https://console.example.com")
    async for client in client_for(cfg):
        first = await client.get("/")
        # the browser sees https: the session cookie is Secure (this client talks http,
        # as the terminator does, so it is handed over by hand)
        assert "secure" in first.headers["set-cookie"].lower()
        client.cookies.set(SESSION_COOKIE, first.cookies[SESSION_COOKIE])
        data = {"token": token(first.text), "job": "conference-reaper",
                "confirm": "yes", "reason": "maintenance"}
        evil = await client.post("/actions/pause", data=data,
                                 headers={"Origin": "https://evil.example.com"})
        assert evil.status_code == 403 and paused(db_dsn) == 0
        done = await client.post("/actions/pause", data=data, headers={
            "Origin": "https://console.example.com", "Sec-Fetch-Site": "same-origin"})
        assert done.status_code == 200, done.text
    assert paused(db_dsn) == 1


async def test_a_form_is_urlencoded_and_small(db_dsn: str,
                                              writable: httpx.AsyncClient) -> None:
    """A multipart form is refused (415: nothing spooled to disk), a form past
    MAX_FORM_BYTES is refused (413) whether or not it says its length; nothing acts."""
    form = await form_token(writable)
    origin = {"Origin": str(writable.base_url).rstrip("/")}
    multipart = await writable.post("/actions/pause", headers=origin, data={
        "token": form, "job": "conference-reaper", "confirm": "yes", "reason": "x"},
        files={"upload": ("a.bin", b"\0" * 1024)})
    assert multipart.status_code == 415
    big = f"token={form}&job=conference-reaper&confirm=yes&reason=" + "x" * MAX_FORM_BYTES
    too_big = await writable.post("/actions/pause", content=big.encode(), headers={
        **origin, "Content-Type": "application/x-www-form-urlencoded"})
    assert too_big.status_code == 413

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: chunked
        yield big.encode()

    streamed = await writable.post("/actions/pause", content=chunks(), headers={
        **origin, "Content-Type": "application/x-www-form-urlencoded"})
    assert streamed.status_code == 413
    assert paused(db_dsn) == 0 and trail_rows(db_dsn) == 0


async def test_a_pause_for_that_does_not_parse_shows_the_form_again(
        db_dsn: str, writable: httpx.AsyncClient) -> None:
    """"2 hours" is not a duration: the confirmation comes back with the error and what
    was typed (400), and no replica is paused, indefinitely or otherwise."""
    response = await post(writable, "/actions/pause", {
        "token": await form_token(writable), "job": "conference-reaper", "confirm": "yes",
        "reason": "db upgrade", "for": "2 hours"})
    assert response.status_code == 400
    assert 'id="error"' in response.text and "for: malformed duration" in response.text
    assert 'value="2 hours"' in response.text and "db upgrade" in response.text
    assert paused(db_dsn) == 0 and trail_rows(db_dsn) == 0


@pytest.mark.parametrize(("path", "ids", "said"), [
    ("/actions/replay", ["²"], "ids: must be a whole number"),
    ("/actions/replay", ["99999999999999999999"], "ids: must be a whole number"),
    ("/actions/requeue", ["not-a-uuid"], "ids: must be UUIDs"),
    ("/actions/release", ["12"], "ids: must be UUIDs"),
])
async def test_ids_must_be_the_type_they_name(
        db_dsn: str, writable: httpx.AsyncClient, path: str, ids: list[str],
        said: str) -> None:
    response = await post(writable, path, {"token": await form_token(writable), "ids": ids,
                                           "confirm": "yes", "reason": "x"})
    assert response.status_code == 400 and said in response.text
    assert trail_rows(db_dsn) == 0


@pytest.mark.parametrize(("page", "said"), [
    ("/history?since=1000000d", "since: must be a duration back"),
    ("/history?since=2026-13-01", "since: must be a duration back"),
    ("/history?before=%C2%B2", "before: must be a whole number"),
    ("/outbox?after=abc", "after: must be a whole number"),
    ("/outbox?before=-1", "before: must be a whole number"),
    ("/recordings?status=Done", "status: must be one of Quarantined, Pending"),
    ("/recordings?window=soon", "window: must be one of due, later, all"),
    ("/recordings?after=garbage", "after: not a cursor of this page"),
])
async def test_page_parameters_that_do_not_parse_are_named_never_a_500(
        read_only: httpx.AsyncClient, page: str, said: str) -> None:
    response = await read_only.get(page)
    assert response.status_code == 400 and said in response.text
    assert 'href="/history"' in response.text  # the navigation is still there


async def test_a_history_since_that_does_not_parse_keeps_the_filter_form(
        read_only: httpx.AsyncClient) -> None:
    response = await read_only.get("/history", params={"since": "1000000d"})
    assert response.status_code == 400
    assert 'name="since" value="1000000d"' in response.text and 'id="error"' in response.text


async def test_an_outbox_id_past_bigint_is_not_found(read_only: httpx.AsyncClient) -> None:
    assert (await read_only.get("/outbox/99999999999999999999")).status_code == 404


async def test_a_huge_payload_shows_a_bounded_preview_and_its_size(
        db_dsn: str, read_only: httpx.AsyncClient) -> None:
    """A 3 MB payload (another writer's row): the page carries its first PREVIEW_CHARS
    characters and its size, never the whole; a small one is pretty-printed whole."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        huge = dead_letter(conn, "kafka:MessageSizeTooLargeError",
                           payload={"blob": "y" * 3_000_000})
        small = dead_letter(conn, "kafka:INVALID_RECORD", key="b", payload={"n": 1})
        (size,) = conn.execute("SELECT octet_length(payload::text) FROM"
                               " messenger.integration_outbox WHERE id = %s",
                               (huge,)).fetchone() or (0,)
    page = await read_only.get(f"/outbox/{huge}")
    assert page.status_code == 200
    assert f"{size:,} bytes: the first {PREVIEW_CHARS:,} characters" in page.text
    assert len(page.content) < 2 * PREVIEW_CHARS + 20_000
    whole = html.unescape((await read_only.get(f"/outbox/{small}")).text)
    assert json.dumps({"n": 1}, indent=2) in whole and "the first" not in whole


async def test_the_audit_runs_on_a_post_only_rate_limited_and_shows_its_age(
        db_dsn: str, read_only: httpx.AsyncClient) -> None:
    """GET /audit?run=1 runs nothing (a cross-site <img> cannot start it); a POST with the
    form token judges the invariants (even on a read-only console: it writes nothing) and
    the page shows the result with its age; a second POST at once is refused (429,
    Retry-After); a POST without the token is refused."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO messenger.integration_outbox (topic, message_key,"
                     " dedupe_key, event_type, payload) VALUES ('t', 'k', 'd', 'e',"
                     " %s)", (Jsonb({}),))
    page = await read_only.get("/audit", params={"run": "1"})
    assert page.status_code == 200 and 'id="never-audited"' in page.text
    no_token = await post(read_only, "/audit/run", {"token": ""})
    assert no_token.status_code == 403
    ran = await post(read_only, "/audit/run", {"token": token(page.text)})
    assert ran.status_code == 303 and ran.headers["location"] == "/audit"
    shown = (await read_only.get("/audit")).text
    assert 'id="last-audit"' in shown and "violation(s), judged" in shown
    assert " s ago by oncall" in shown
    again = await post(read_only, "/audit/run", {"token": token(page.text)})
    assert again.status_code == 429
    assert 0 < int(again.headers["retry-after"]) <= AUDIT_MIN_INTERVAL_S
    assert trail_rows(db_dsn) == 0


def test_cli_replay_of_a_superscript_id_is_refused_not_a_traceback(
        db_dsn: str, tmp_path: Path) -> None:
    """`safetynet replay ²`: '²'.isdigit() is true and int('²') fails; it is named as not
    a dead letter (exit 2), nothing changes, and the refusal is recorded."""
    done = cli(postgres_only_config(tmp_path, db_dsn), "replay", "²", "--reason", "typo")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "not dead letters, nothing changed" in done.stderr and "²" in done.stderr
