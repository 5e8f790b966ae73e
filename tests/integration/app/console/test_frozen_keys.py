"""Frozen keys (issue #38 item 2): every outbox key held back behind a dead letter or a row
in retry, with how many events wait and the action that releases it — on the console's
page (linked from the outbox page; replay or set aside, confirmed and trailed) and in
`safetynet dead-letters --keys`."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import psycopg
import pytest
from psycopg.types.json import Jsonb

from actors.outbox.queries import OUTBOX_QUERIES
from supervision.app.frozen_keys import DEAD_LETTER, RETRY, frozen_keys
from tests.cli import cli, postgres_only_config
from tests.integration.app.console.support import SCRIPT, console_config, dead_letter
from tests.integration.app.console.test_console_asgi import client_for, form_token, post, token


def row(conn: psycopg.Connection, key: str, *, last_error: str | None = None,
        attempts: int = 0, published: bool = False) -> int:
    (row_id,) = conn.execute(
        "INSERT INTO messenger.integration_outbox (topic, message_key, dedupe_key,"
        " event_type, payload, publish_attempts, last_error, published_at) VALUES ('t', %s,"
        " gen_random_uuid()::text, 'e', %s, %s, %s, CASE WHEN %s THEN now() END)"
        " RETURNING id", (key, Jsonb({}), attempts, last_error, published)).fetchone() or (0,)
    return int(row_id)


def claimable(dsn: str) -> set[int]:
    """The rows the relay's claim would take now (rolled back)."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(OUTBOX_QUERIES["outbox_claim_batch"], {
            "after_id": 0, "skip": [], "held_topics": [], "batch_size": 100,
            "max_row_bytes": 10**6, "max_bytes": 10**7}).fetchall()
        conn.rollback()
    return {int(r[0]) for r in rows}


def incident(conn: psycopg.Connection) -> dict[str, int]:
    """Key a: a blocking dead letter (a day old) and two rows behind it; key b: a row in
    retry and one behind it; key c: a row in retry alone (nothing held back); key d: a
    dead letter that blocks nothing; key e: published rows only."""
    ids = {"a": dead_letter(conn, SCRIPT, key="a", days_old=1)}
    ids["a1"] = row(conn, "a")
    ids["a2"] = row(conn, "a")
    row(conn, "a", published=True)
    ids["b"] = row(conn, "b", last_error="kafka:RequestTimedOutError", attempts=3)
    ids["b1"] = row(conn, "b")
    ids["c"] = row(conn, "c", last_error="kafka:RequestTimedOutError", attempts=1)
    ids["d"] = dead_letter(conn, "kafka:INVALID_RECORD", key="d")
    conn.execute("UPDATE safetynet.outbox_dead_letters SET blocks_key = false"
                 " WHERE outbox_id = %s", (ids["d"],))
    row(conn, "d")
    row(conn, "e", published=True)
    return ids


def test_every_held_key_with_its_blocker_and_what_waits(db_dsn: str) -> None:
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        ids = incident(conn)
        found = frozen_keys(conn)
    assert found.total == 2
    assert [(k.message_key, k.kind, k.blocker_id, k.waiting, k.attempts, k.error)
            for k in found.keys] == [
        ("a", DEAD_LETTER, ids["a"], 2, None, SCRIPT),
        ("b", RETRY, ids["b"], 1, 3, "kafka:RequestTimedOutError")]
    assert found.keys[0].release == f"safetynet replay {ids['a']} --reason TEXT"


@pytest.fixture
async def writable(db_dsn: str) -> AsyncIterator[httpx.AsyncClient]:
    async for client in client_for(console_config(db_dsn, allow_actions=True)):
        yield client


async def test_the_console_page_releases_each_key_confirmed_and_trailed(
        db_dsn: str, writable: httpx.AsyncClient) -> None:
    """Linked from the outbox page, the page lists both keys (the <script> reason as
    text) with Replay for the dead letter and Set aside for the row in retry; setting it
    aside dead-letters it without blocking its key and is trailed as release-key; the
    replay releases the other key; a blocker that moved on meanwhile is skipped."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        ids = incident(conn)
    assert 'href="/outbox/keys"' in (await writable.get("/outbox")).text
    page = (await writable.get("/outbox/keys")).text
    assert re.search(rf'id="key-{ids["a"]}">.*?<td>2</td>', page, re.S)
    assert f'id="release-{ids["a"]}">Replay it' in page
    assert f'id="release-{ids["b"]}">Set it aside' in page
    assert "&lt;script&gt;" in page and SCRIPT not in page
    assert ids["a1"] not in claimable(db_dsn)  # held behind the dead letter
    data = {"token": token(page), "ids": [str(ids["b"])]}
    confirm = await post(writable, "/actions/release-key", data)
    assert confirm.status_code == 200 and "without blocking its key" in confirm.text
    done = await post(writable, "/actions/release-key",
                      {**data, "confirm": "yes", "reason": "broker flapping, move on"})
    assert done.status_code == 200 and "1 changed" in done.text, done.text
    after = claimable(db_dsn)
    assert ids["b1"] in after and ids["b"] not in after  # the key goes on without it
    again = await post(writable, "/actions/release-key",
                       {**data, "confirm": "yes", "reason": "twice"})
    assert "0 changed" in again.text and f"<code>{ids['b']}</code>" in again.text  # skipped
    replay = await post(writable, "/actions/replay", {
        "token": token(page), "ids": [str(ids["a"])], "confirm": "yes", "reason": "fixed"})
    assert replay.status_code == 200 and "1 changed" in replay.text
    assert {ids["a"], ids["a1"], ids["a2"]} <= claimable(db_dsn)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        assert frozen_keys(conn).total == 0
        (blocks, reason), = conn.execute(
            "SELECT blocks_key, reason FROM safetynet.outbox_dead_letters WHERE outbox_id = %s",
            (ids["b"],)).fetchall()
        trail = conn.execute("SELECT verb, ids, reason, result->'skipped' FROM"
                             " safetynet.operator_actions ORDER BY id").fetchall()
    assert (blocks, reason) == (False, "set aside: kafka:RequestTimedOutError")
    assert trail == [("release-key", [str(ids["b"])], "broker flapping, move on", []),
                     ("release-key", [], "twice", [str(ids["b"])]),
                     ("replay", [str(ids["a"])], "fixed", [])]
    assert "no key held back" in (await writable.get("/outbox/keys")).text


async def test_a_read_only_console_shows_the_keys_and_the_cli_to_release_them(
        db_dsn: str) -> None:
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        ids = incident(conn)
    async for client in client_for(console_config(db_dsn)):
        page = (await client.get("/outbox/keys")).text
        assert f"safetynet replay {ids['a']} --reason TEXT" in page
        assert 'id="release-' not in page
        refused = await post(client, "/actions/release-key", {
            "token": await form_token(client, "/audit"), "ids": [str(ids["b"])],
            "confirm": "yes", "reason": "x"})
        assert refused.status_code == 403


def test_cli_dead_letters_keys_shows_the_same(db_dsn: str, tmp_path: Path) -> None:
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        ids = incident(conn)
    config = postgres_only_config(tmp_path, db_dsn)
    shown = cli(config, "dead-letters", "--keys")
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0].startswith("t/a: 2 waiting since ") and f"behind {ids['a']} (dead" \
        " letter" in lines[0] and f"release: safetynet replay {ids['a']}" in lines[0]
    assert lines[1].startswith("t/b: 1 waiting since ") and "3 attempt(s)" in lines[1]
    assert lines[-1] == "2 key(s) held back"
    as_json = json.loads(cli(config, "dead-letters", "--keys", "--json").stdout)
    assert as_json["total"] == 2 and [k["blocker_id"] for k in as_json["keys"]] == [
        ids["a"], ids["b"]]
    both = cli(config, "dead-letters", "--keys", "--purge", "--reason", "x")
    assert both.returncode == 2 and "--keys does not go with --purge" in both.stderr
