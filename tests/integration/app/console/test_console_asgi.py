"""The console over ASGI (no browser): every page, every action, the security rules, against a
real database."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

import httpx
import psycopg
import pytest
from prometheus_client import CollectorRegistry, start_http_server

from supervision.app.console.app import build_app
from supervision.app.console.security import MAX_FAILURES, SESSION_COOKIE, Gate
from supervision.app.settings import Config
from supervision.db.database import open_database
from supervision.db.pgconn import conninfo
from supervision.metrics import LastCycles
from tests.integration.app.console.support import (
    SCRIPT,
    basic,
    console_config,
    dead_letter,
    quarantine,
)
from tests.integration.app.test_runbook import remember_poison
from tests.messenger import attempt, insert_conference, new_id

PAGES = ("/", "/recordings", "/recordings?status=Pending&window=due",
         "/recordings?status=Pending&window=later", "/conferences", "/outbox", "/audit",
         "/history")


async def client_for(cfg: Config) -> AsyncIterator[httpx.AsyncClient]:
    async with open_database(conninfo(cfg.postgres, "console-test"), size=2) as db:
        app = build_app(cfg, db, Gate(cfg.console))
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url=f"http://{cfg.console.listen}",
                                     headers=basic()) as client:
            yield client


@pytest.fixture
async def writable(db_dsn: str) -> AsyncIterator[httpx.AsyncClient]:
    async for client in client_for(console_config(db_dsn, allow_actions=True)):
        yield client


@pytest.fixture
async def read_only(db_dsn: str) -> AsyncIterator[httpx.AsyncClient]:
    async for client in client_for(console_config(db_dsn)):
        yield client


def token(html: str) -> str:
    match = re.search(r'name="token" value="([0-9a-f]+)"', html)
    assert match, "no form token on the page"
    return match.group(1)


async def form_token(client: httpx.AsyncClient, page: str = "/") -> str:
    response = await client.get(page)
    assert response.status_code == 200, response.text
    return token(response.text)


async def post(client: httpx.AsyncClient, path: str, data: dict[str, Any]) -> httpx.Response:
    """A form POST as the browser sends it from the console's own page."""
    return await client.post(path, data=data, headers={
        "Sec-Fetch-Site": "same-origin", "Origin": str(client.base_url).rstrip("/")})


async def test_every_page_renders_and_is_linked_from_the_overview(
        read_only: httpx.AsyncClient) -> None:
    """Each page answers 200 with the security headers, and the overview links each one."""
    overview = (await read_only.get("/")).text
    for page in ("/recordings", "/conferences", "/outbox", "/audit", "/history"):
        assert f'href="{page}"' in overview
    for page in PAGES:
        response = await read_only.get(page)
        assert response.status_code == 200, (page, response.text)
        csp = response.headers["content-security-policy"]
        assert "frame-ancestors 'none'" in csp and "script-src" not in csp
        assert "default-src 'none'" in csp
        assert response.headers["x-frame-options"] == "DENY"
        assert "<script" not in response.text


async def test_overview_shows_each_jobs_last_leader_held_given_back_or_expired(
        db_dsn: str, read_only: httpx.AsyncClient) -> None:
    """A lease held now, one given back at the end of a cycle (expires_at -infinity) and
    one run out each render in words, with their holders as the replicas seen."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        for job, holder, expires in (
                ("recording-finalize", "host-a:1:x", "now() + interval '20 seconds'"),
                ("conference-reaper", "host-b:2:y", "'-infinity'"),
                ("outbox-relay", "host-a:1:x", "now() - interval '1 minute'")):
            conn.execute("INSERT INTO safetynet.leases (job, holder, holder_pid, term,"  # noqa: S608
                         f" acquired_at, expires_at) VALUES (%s, %s, 1, 3, now(), {expires})",
                         (job, holder))
    html = (await read_only.get("/")).text
    for state in ("holding", "between cycles", "expired"):
        assert f"<td>{state}" in html, state
    assert "<code>host-a:1</code> <code>host-b:2</code>" in html


async def test_quarantined_rows_show_ids_and_last_error_escaped(
        db_dsn: str, read_only: httpx.AsyncClient) -> None:
    """A quarantined row's recording id and last_error are listed; a planted <script> in
    last_error renders as text, on the overview and the recordings page."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        _, recording_id = quarantine(conn, SCRIPT)
    for page in ("/", "/recordings?status=Quarantined"):
        html = (await read_only.get(page)).text
        assert recording_id in html
        assert "&lt;script&gt;document.title=" in html and SCRIPT not in html


async def test_search_finds_a_row_by_recording_session_or_file_id(
        db_dsn: str, read_only: httpx.AsyncClient) -> None:
    """Searching a recording id, its session id or its file id lists its finalize row;
    an unknown id lists nothing."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        _, recording_id = quarantine(conn, "object:content_type_unknown")
        session_id, = conn.execute("SELECT session_id FROM messenger.call_recordings"
                                   " WHERE id = %s", (recording_id,)).fetchone() or ("",)
        conn.execute("UPDATE messenger.call_recordings SET file_id = 'k/some-file.ogg'"
                     " WHERE id = %s", (recording_id,))
    for q in (recording_id, str(session_id), "k/some-file.ogg"):
        html = (await read_only.get("/recordings", params={"q": q})).text
        assert recording_id in html, q
    html = (await read_only.get("/recordings", params={"q": new_id()})).text
    assert "nothing here" in html


async def test_requeue_needs_a_confirmed_reason_and_acts_on_the_snapshot_only(
        db_dsn: str, writable: httpx.AsyncClient) -> None:
    """The first POST only confirms; without a reason nothing changes (400); with one, the
    rows seen Quarantined are requeued, a row that moved on is skipped, a row quarantined
    after the page was rendered is untouched, and the history names the actor and reason."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        seen, seen_rec = quarantine(conn, "s3:http_503")
        moved, _ = quarantine(conn, "s3:http_503")
    form = await form_token(writable, "/recordings?status=Quarantined")
    data = {"token": form, "status": "Quarantined", "ids": [seen, moved]}
    confirm = await post(writable, "/actions/requeue", data)
    assert confirm.status_code == 200 and seen in confirm.text and 'name="reason"' in confirm.text
    no_reason = await post(writable, "/actions/requeue", {**data, "confirm": "yes"})
    assert no_reason.status_code == 400 and "a reason is required" in no_reason.text
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        assert attempt(conn, seen_rec)["status"] == "Quarantined"
        conn.execute("UPDATE messenger.recording_finalize_attempts SET status = 'Done'"
                     " WHERE id = %s", (moved,))
        later, later_rec = quarantine(conn, "s3:http_503")  # after the page was rendered
    done = await post(writable, "/actions/requeue",
                      {**data, "confirm": "yes", "reason": "bucket <b>policy</b> fixed"})
    assert done.status_code == 200, done.text
    assert "1 changed" in done.text and moved in done.text  # skipped, named
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        assert attempt(conn, seen_rec)["status"] == "Pending"
        assert attempt(conn, later_rec)["status"] == "Quarantined"
        (row,) = conn.execute("SELECT actor, origin, verb, ids, reason, result"
                              " FROM safetynet.operator_actions").fetchall()
    assert row[:5] == ("oncall", "console", "requeue", [seen], "bucket <b>policy</b> fixed")
    assert row[5]["skipped"] == [moved]
    history = (await writable.get("/history")).text
    assert seen in history and "bucket &lt;b&gt;policy&lt;/b&gt; fixed" in history
    assert later not in history


async def test_replay_acts_only_on_the_dead_letters_posted_and_is_trailed(
        db_dsn: str, writable: httpx.AsyncClient) -> None:
    """The outbox page offers each dead letter (its <script> reason as text) for a replay;
    the confirmed replay puts back only the posted ids still dead-lettered, skips one
    replayed meanwhile, leaves one dead-lettered after the page loaded alone, clears the
    row's mark so its key is no longer blocked, and writes the trail row."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        seen = dead_letter(conn, SCRIPT, key="a")
        moved = dead_letter(conn, "kafka:INVALID_RECORD", key="b")
    page = (await writable.get("/outbox")).text
    assert f'id="replay-{seen}"' in page and 'id="replay-selected"' in page
    assert "&lt;script&gt;document.title=" in page and SCRIPT not in page
    assert 'http-equiv="refresh"' not in page  # a refresh would lose the checked rows
    detail = (await writable.get(f"/outbox/{seen}")).text
    assert 'id="replay-this"' in detail
    data = {"token": token(page), "ids": [str(seen), str(moved)]}
    confirm = await post(writable, "/actions/replay", data)
    assert confirm.status_code == 200 and f"<code>{seen}</code>" in confirm.text
    assert "a key it blocked is released" in confirm.text
    no_reason = await post(writable, "/actions/replay", {**data, "confirm": "yes"})
    assert no_reason.status_code == 400
    nothing = await post(writable, "/actions/replay", {"token": data["token"],
                                                       "confirm": "yes", "reason": "x"})
    assert nothing.status_code == 400 and "nothing checked" in nothing.text
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM safetynet.operator_actions"
                            ).fetchone() == (0,)
        conn.execute("DELETE FROM safetynet.outbox_dead_letters WHERE outbox_id = %s",
                     (moved,))  # replayed by someone else meanwhile
        later = dead_letter(conn, "kafka:INVALID_RECORD", key="a")  # after the page loaded
    done = await post(writable, "/actions/replay",
                      {**data, "confirm": "yes", "reason": "broker limit <b>raised</b>"})
    assert done.status_code == 200, done.text
    assert "1 changed" in done.text and f"<code>{moved}</code>" in done.text  # skipped
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        dead = [r[0] for r in conn.execute("SELECT outbox_id FROM"
                                           " safetynet.outbox_dead_letters ORDER BY 1")]
        (mark,) = conn.execute("SELECT last_error FROM messenger.integration_outbox"
                               " WHERE id = %s", (seen,)).fetchone() or (None,)
        (row,) = conn.execute("SELECT actor, origin, verb, ids, reason, result"
                              " FROM safetynet.operator_actions").fetchall()
    assert dead == [later] and mark is None
    assert row[:5] == ("oncall", "console", "replay", [str(seen)],
                       "broker limit <b>raised</b>")
    assert row[5]["changed"] == 1 and row[5]["skipped"] == [str(moved)]
    history = (await writable.get("/history")).text
    assert "broker limit &lt;b&gt;raised&lt;/b&gt;" in history


async def test_pause_and_resume_from_the_console_are_trailed(
        db_dsn: str, writable: httpx.AsyncClient) -> None:
    """Pause (with an expiry) shows on the overview; resume ends it; both are in the
    history with their reasons."""
    form = await form_token(writable)
    paused = await post(writable, "/actions/pause", {
        "token": form, "job": "conference-reaper", "confirm": "yes", "reason": "db upgrade",
        "for": "2h"})
    assert paused.status_code == 200, paused.text
    overview = (await writable.get("/")).text
    assert "paused by oncall@" in overview and "db upgrade" in overview
    assert 'id="resume-conference-reaper"' in overview
    resumed = await post(writable, "/actions/resume", {
        "token": form, "job": "conference-reaper", "confirm": "yes", "reason": "done"})
    assert resumed.status_code == 200
    assert 'id="pause-conference-reaper"' in (await writable.get("/")).text
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT verb, reason FROM safetynet.operator_actions ORDER BY id"
                            ).fetchall()
    assert rows == [("pause", "db upgrade"), ("resume", "done")]


async def test_release_of_a_poison_conference_and_audit_are_trailed(
        db_dsn: str, writable: httpx.AsyncClient) -> None:
    """A poison conference is listed with its escaped reason and released by the console;
    an audit started from the console is recorded with its violation count."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conf = insert_conference(conn, last_activity_ago=120, started_ago=-3600)
        remember_poison(conn, conf.id, SCRIPT)
    page = (await writable.get("/conferences")).text
    assert conf.id in page and "&lt;script&gt;" in page and SCRIPT not in page
    done = await post(writable, "/actions/release", {
        "token": token(page), "ids": [conf.id], "confirm": "yes", "reason": "fixed"})
    assert done.status_code == 200 and "1 changed" in done.text
    audit = await post(writable, "/actions/audit", {
        "token": token(page), "confirm": "yes", "reason": "after the release"})
    assert audit.status_code == 200, audit.text
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM safetynet.conference_poison"
                            ).fetchone() == (0,)
        verbs = [r[0] for r in conn.execute(
            "SELECT verb FROM safetynet.operator_actions ORDER BY id")]
    assert verbs == ["release", "audit"]


async def test_read_only_console_refuses_every_action(
        db_dsn: str, read_only: httpx.AsyncClient) -> None:
    """With allow_actions false no action form is shown and each action answers 403,
    changing nothing and recording nothing."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        seen, rec = quarantine(conn, "s3:http_503")
        dead = dead_letter(conn, "kafka:INVALID_RECORD")
    page = (await read_only.get("/recordings?status=Quarantined")).text
    assert "requeue-selected" not in page
    outbox = (await read_only.get("/outbox")).text
    assert str(dead) in outbox and "replay-selected" not in outbox
    assert 'name="ids"' not in outbox and 'http-equiv="refresh"' in outbox
    form = token(page)
    for path, data in (("/actions/requeue", {"ids": [seen]}),
                       ("/actions/pause", {"job": "recording-finalize"}),
                       ("/actions/resume", {"job": "recording-finalize"}),
                       ("/actions/release", {"ids": [new_id()]}), ("/actions/audit", {}),
                       ("/actions/replay", {"ids": [str(dead)]})):
        response = await post(read_only, path, {**data, "token": form, "confirm": "yes",
                                                "reason": "x"})
        assert response.status_code == 403 and "read-only" in response.text, path
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        assert attempt(conn, rec)["status"] == "Quarantined"
        assert conn.execute("SELECT count(*) FROM safetynet.outbox_dead_letters"
                            ).fetchone() == (1,)
        assert conn.execute("SELECT count(*) FROM safetynet.operator_actions"
                            ).fetchone() == (0,)


async def test_cross_site_posts_and_missing_tokens_are_refused(
        writable: httpx.AsyncClient) -> None:
    """A POST marked cross-site, from another Origin, without the session cookie or
    with a wrong token is refused (403) before anything acts; GETs never act."""
    form = await form_token(writable)
    data = {"token": form, "job": "recording-finalize", "confirm": "yes", "reason": "x"}
    for headers in ({"Sec-Fetch-Site": "cross-site"}, {"Sec-Fetch-Site": "same-site"},
                    {"Origin": "http://evil.test"}):
        response = await writable.post("/actions/pause", data=data, headers=headers)
        assert response.status_code == 403 and "cross-site" in response.text
    wrong = await post(writable, "/actions/pause", {**data, "token": "0" * 64})
    assert wrong.status_code == 403 and "token" in wrong.text
    cookies = writable.cookies
    writable.cookies = httpx.Cookies()
    no_session = await post(writable, "/actions/pause", data)
    assert no_session.status_code == 403
    writable.cookies = cookies
    assert (await writable.get("/actions/pause")).status_code == 405
    overview = (await writable.get("/")).text
    assert 'id="pause-recording-finalize"' in overview  # still running


async def test_basic_auth_refuses_wrong_passwords_and_rate_limits_failures(
        read_only: httpx.AsyncClient) -> None:
    """No credentials → 401 with a challenge; wrong ones → 401; after MAX_FAILURES
    failures even the right password gets 429 until the window passes."""
    assert (await read_only.get("/", headers={"Authorization": ""})).status_code == 401
    bare = await read_only.get("/", headers={"Authorization": "Bearer x"})
    assert bare.status_code == 401 and "Basic" in bare.headers["www-authenticate"]
    for _ in range(MAX_FAILURES):
        response = await read_only.get("/", headers=basic(password="guess"))
        assert response.status_code == 401
    limited = await read_only.get("/", headers=basic())
    assert limited.status_code == 429 and "retry-after" in limited.headers


PROXY_SECRET = "proxy-secret-4711-abcdef"


async def test_proxy_header_is_believed_only_from_trusted_proxies_with_the_secret(
        db_dsn: str) -> None:
    """auth = proxy_header: the header from a trusted address with the shared secret logs
    in as its user; from any other address, or without the secret (any local process),
    it is refused."""
    for trusted, secret, expect in ((["127.0.0.1"], PROXY_SECRET, 200),
                                    (["10.1.0.0/16"], PROXY_SECRET, 403),
                                    (["127.0.0.1"], None, 403)):
        cfg = console_config(db_dsn, auth="proxy_header", trusted_proxies=trusted,
                             proxy_secret=PROXY_SECRET)
        headers = {"X-Forwarded-User": "ana@corp"}
        if secret:
            headers["X-Safetynet-Proxy-Secret"] = secret
        async with open_database(conninfo(cfg.postgres, "console-test"), size=1) as db:
            transport = httpx.ASGITransport(app=build_app(cfg, db), client=("127.0.0.1", 5))
            async with httpx.AsyncClient(transport=transport,
                                         base_url=f"http://{cfg.console.listen}") as c:
                response = await c.get("/", headers=headers)
        assert response.status_code == expect
        if expect == 200:
            assert "ana@corp" in response.text


async def test_overview_says_when_the_daemon_on_this_host_does_not_answer(
        read_only: httpx.AsyncClient) -> None:
    """No daemon behind http.listen: the overview still renders from PostgreSQL and says
    the daemon's own figures (breaker, faults, cycles) are unavailable, and why."""
    overview = await read_only.get("/")
    assert overview.status_code == 200
    assert 'id="daemon-down"' in overview.text and "ConnectError" in overview.text
    assert 'id="verdicts"' in overview.text


async def test_overview_shows_each_jobs_last_cycle_from_the_daemons_metrics(
        db_dsn: str) -> None:
    """A daemon at http.listen exporting safetynet_last_cycle: the overview shows each
    job's last cycle with its status, duration and non-zero counts."""
    cfg = console_config(db_dsn)
    host, _, port = cfg.http.listen.rpartition(":")
    registry = CollectorRegistry()
    cycles = LastCycles()
    registry.register(cycles)
    cycles.record("recording-finalize", "ok", {"reconciled": 7, "failed": 2,
                                               "quarantined": 0, "duration_ms": 340})
    cycles.record("conference-reaper", "error", {"empty_timeout": 0, "duration_ms": 5})
    server, thread = start_http_server(int(port), addr=host, registry=registry)
    try:
        async for client in client_for(cfg):
            html = (await client.get("/")).text
    finally:
        server.shutdown()
        thread.join(5)
    finalize = re.search(r'<tr id="last-cycle-recording-finalize">(.*?)</tr>', html, re.S)
    assert finalize, html
    assert "ok, ended" in finalize.group(1) and "340 ms" in finalize.group(1)
    assert "reconciled 7" in finalize.group(1) and "failed 2" in finalize.group(1)
    assert "quarantined" not in finalize.group(1)
    reaper = re.search(r'<tr id="last-cycle-conference-reaper">(.*?)</tr>', html, re.S)
    assert reaper and "error, ended" in reaper.group(1) and "nothing to do" in reaper.group(1)
    assert 'id="last-cycle-outbox-relay"' not in html  # no cycle of it yet


async def test_pages_say_why_while_postgres_is_down(db_dsn: str) -> None:
    """With the database unreachable, every page still answers, 503, naming PostgreSQL."""
    cfg = console_config("postgresql://nobody@127.0.0.1:9/none?connect_timeout=2",
                         allow_actions=True)
    async for client in client_for(cfg):
        for page in ("/", "/recordings", "/outbox", "/history"):
            response = await client.get(page)
            assert response.status_code == 503
            assert "PostgreSQL" in response.text and 'href="/history"' in response.text


async def test_outbox_page_shows_a_dead_letter_and_its_payload_as_text(
        db_dsn: str, read_only: httpx.AsyncClient) -> None:
    """A dead letter's reason and its row's payload render escaped."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        (row_id,) = conn.execute(
            "INSERT INTO messenger.integration_outbox (topic, message_key, dedupe_key,"
            " event_type, payload) VALUES ('t', 'k', 'd', 'e', %s) RETURNING id",
            (psycopg.types.json.Jsonb({"note": SCRIPT}),)).fetchone() or (0,)
        conn.execute("INSERT INTO safetynet.outbox_dead_letters (outbox_id, topic,"
                     " message_key, reason, blocks_key) VALUES (%s, 't', 'k', %s, false)",
                     (row_id, SCRIPT))
    page = (await read_only.get("/outbox")).text
    assert f'href="/outbox/{row_id}"' in page and "&lt;script&gt;" in page
    assert SCRIPT not in page
    detail = (await read_only.get(f"/outbox/{row_id}")).text
    assert "&lt;script&gt;document.title=" in detail and SCRIPT not in detail
    assert (await read_only.get("/outbox/999999999")).status_code == 404


def test_session_cookie_name_is_stable() -> None:
    """The cookie the browser tests and docs name."""
    assert SESSION_COOKIE == "safetynet_console_session"
