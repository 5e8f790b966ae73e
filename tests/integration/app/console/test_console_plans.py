"""The console's pages at a backlog: every statement a page runs reads a bounded number of
buffers, the same at twice the rows.

At a million recordings and a million outbox rows the pages that sorted a whole status
range (the recordings pages, 1.8 s), sorted every quarantined row (the overview) or
joined a window of recordings by walking every terminal one took seconds
(docs/benchmarks.md, "Operator console pages"). The statements are the ones each page
really runs (recorded from the driver while the page renders through the ASGI app), then
run again under EXPLAIN (ANALYZE, BUFFERS) at a backlog and at twice that backlog: a keyset
page or a capped count reads the same buffers at both; a scan or sort of a status range
reads twice as many.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from supervision.app.queries import ALL_QUERIES
from tests.integration.app.console.support import console_config
from tests.integration.app.console.test_console_asgi import client_for, form_token, post

ROWS = 50_000  # per batch: past every 10,000 cap (a quarter quarantined, half the outbox live)
SEED = """
WITH src AS (
    SELECT md5(%(tag)s || 'r' || n)::uuid AS rid, md5(%(tag)s || 's' || n)::uuid AS sid,
           md5(%(tag)s || 'a' || n)::uuid AS aid, n %% 10 = 9 AS available, n
    FROM generate_series(0, %(rows)s - 1) AS n
),
sessions AS (
    INSERT INTO messenger.call_sessions (id, status, started_at, ended_at, created_at,
        updated_at)
    SELECT sid, 'Ended', now() - interval '2 hours', now() - interval '1 hour',
           now() - interval '2 hours', now()
    FROM src
),
recordings AS (
    INSERT INTO messenger.call_recordings (id, session_kind, session_id, media_type,
        trigger, status, file_id, created_at, updated_at)
    SELECT rid, 'Direct', sid, 'Audio', 'Manual',
           CASE WHEN available THEN 'Available' ELSE 'Uploading' END,
           CASE WHEN available THEN 'f/' || rid END, now() - interval '2 hours', now()
    FROM src
)
-- one next_attempt_at per group (rows rescheduled together share it): a quarter
-- quarantined, a quarter rescheduled an hour ahead, the rest due
INSERT INTO messenger.recording_finalize_attempts (id, recording_id, session_kind,
    session_id, status, attempts, last_error, next_attempt_at, created_at, updated_at)
SELECT aid, rid, 'Direct', sid, CASE WHEN n %% 4 = 0 THEN 'Quarantined' ELSE 'Pending' END,
       0, CASE WHEN n %% 4 = 0 THEN 'object:content_type_unknown:text/html' END,
       date_trunc('minute', now()) + CASE WHEN n %% 4 = 1 THEN interval '1 hour'
                                          ELSE interval '-1 hour' END,
       now() - interval '1 hour', now()
FROM src
"""
OUTBOX = """
INSERT INTO messenger.integration_outbox (topic, message_key, dedupe_key, event_type,
    payload, created_at, published_at, publish_attempts)
SELECT 't', md5(%(tag)s || 'k' || n), md5(%(tag)s || 'd' || n), 'e', '{}'::jsonb,
       now() - interval '1 hour', CASE WHEN n %% 2 = 0 THEN NULL ELSE now() END, 1
FROM generate_series(1, %(rows)s) AS n
"""
PAGES = ("/", "/?span=24h", "/jobs/outbox-relay", "/recordings?status=Quarantined",
         "/recordings?status=Pending&window=due",
         "/recordings?status=Pending&window=later", "/recordings?q=no-such-file-id",
         "/conferences", "/outbox", "/outbox/keys", "/audit", "/history")
# the auditor's check of open finalize rows (attempts past the limit) has no index to read
# them through: `audit` reads every Pending and Quarantined row (docs/benchmarks.md)
UNBOUNDED = {"audit_finalize_attempts_open"}
NAMES = {text: name for name, text in ALL_QUERIES.items()}


def grow(dsn: str, tag: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(SEED, {"tag": tag, "rows": ROWS})
        conn.execute(OUTBOX, {"tag": tag, "rows": ROWS})
        conn.execute("VACUUM ANALYZE messenger.call_sessions, messenger.call_recordings,"
                     " messenger.recording_finalize_attempts, messenger.integration_outbox")


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, Any]]]:
    """Every named statement the driver executes, with its parameters."""
    seen: list[tuple[str, Any]] = []
    execute = psycopg.Cursor.execute

    def spy(self: psycopg.Cursor[Any], query: Any, params: Any = None,
            **kwargs: Any) -> Any:
        text = query.decode() if isinstance(query, bytes) else query
        if isinstance(text, str) and text in NAMES:
            seen.append((text, params))
        return execute(self, query, params, **kwargs)

    monkeypatch.setattr(psycopg.Cursor, "execute", spy)
    yield seen


def total_buffers(plan: str) -> int:
    """Shared buffers hit and read by the whole statement (the root node's line; none for
    a statement that reads no table, such as the charts' current minute)."""
    line = next((line for line in plan.splitlines() if "Buffers:" in line), "")
    return sum(int(n) for n in re.findall(r"(?:hit|read)=(\d+)", line.split("temp")[0]))


def read_per_statement(dsn: str, statements: list[tuple[str, Any]]) -> dict[str, int]:
    out: dict[str, int] = {}
    with psycopg.connect(dsn) as conn:
        for text, params in statements:
            if not text.lstrip().upper().startswith(("SELECT", "WITH")):
                continue  # SET TRANSACTION and the like
            plan = "\n".join(r[0] for r in conn.execute(
                ("EXPLAIN (ANALYZE, BUFFERS) " + text).encode(), params).fetchall())
            conn.rollback()
            name = NAMES[text]
            out[name] = max(out.get(name, 0), total_buffers(plan))
    return out


async def test_every_console_page_reads_the_same_buffers_at_twice_the_backlog(
        db_dsn: str, recorded: list[tuple[str, Any]]) -> None:
    """50,000 recordings (a quarter quarantined, rows rescheduled together sharing one
    next_attempt_at) and 50,000 outbox rows, then as many again: each statement every
    page runs reads at most half as many buffers again at the double backlog (a deeper
    index costs one more page per probe). Sorting a status range for a page, or every
    quarantined row for the overview, read twice as many."""
    grow(db_dsn, "a")
    async for client in client_for(console_config(db_dsn)):
        for page in PAGES:
            response = await client.get(page)
            assert response.status_code == 200, (page, response.text)
        audit = await post(client, "/audit/run", {"token": await form_token(client, "/audit")})
        assert audit.status_code == 303, audit.text
    statements = list({(t, repr(p)): (t, p) for t, p in recorded}.values())
    names = {NAMES[t] for t, _ in statements}
    assert {"console_finalize_page", "finalize_attempts_quarantined_list", "slo_recordings",
            "console_outbox_stats", "finalize_attempts_stats", "outbox_frozen_keys",
            "job_minutes_since"} <= names, names
    before = read_per_statement(db_dsn, statements)
    grow(db_dsn, "b")
    after = read_per_statement(db_dsn, statements)
    grew = {name: (before[name], after[name]) for name in before
            if name not in UNBOUNDED and after[name] > before[name] * 1.5 + 50}
    assert grew == {}, grew
