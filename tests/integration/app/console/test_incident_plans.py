"""An incident's preview at a backlog: each filter's statement walks its index over the
time range (supervision/app/sql/incidents.sql), so a window that holds few rows reads the
same buffers at twice the table, and a window that holds many reads at most
EXAMINE_MAX of them."""

from __future__ import annotations

import datetime as dt
from typing import Any

import psycopg
import pytest

from supervision.app import incidents
from supervision.app.queries import ALL_QUERIES
from supervision.app.trail import Verb
from tests.integration.app.console.test_console_plans import grow, total_buffers

DEAD = """
INSERT INTO safetynet.outbox_dead_letters (outbox_id, topic, message_key, reason,
    blocks_key, created_at)
SELECT id, topic, left(message_key, 400), 'kafka:MESSAGE_TOO_LARGE', false,
       now() - interval '1 hour'
FROM messenger.integration_outbox
WHERE published_at IS NULL AND id %% 4 = 0
ON CONFLICT DO NOTHING
"""
FILTERS = {
    "incident_finalize_quarantined": (Verb.REQUEUE, "Quarantined"),
    "incident_finalize_pending": (Verb.REQUEUE, "Pending"),
    "incident_dead_letters": (Verb.REPLAY, None),
}
INDEXES = {"incident_finalize_quarantined": "ix_rfa_quarantined",
           "incident_finalize_pending": "ix_rfa_queue",
           "incident_dead_letters": "ix_dead_letters_created"}


def seed(dsn: str, tag: str) -> None:
    grow(dsn, tag)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(DEAD, {})
        conn.execute("VACUUM ANALYZE safetynet.outbox_dead_letters")


def explain(dsn: str, name: str, since: dt.datetime, until: dt.datetime) -> str:
    params: dict[str, Any] = {
        "since": since, "until": until, "pattern": incidents.like_pattern("no such error"),
        "topic": None, "key_prefix": None, "examine": incidents.EXAMINE_MAX,
        "limit": incidents.SNAPSHOT_MAX + 1}
    with psycopg.connect(dsn) as conn:
        return "\n".join(r[0] for r in conn.execute(
            ("EXPLAIN (ANALYZE, BUFFERS) " + ALL_QUERIES[name]).encode(), params))


@pytest.mark.parametrize("name", sorted(FILTERS))
def test_a_preview_walks_its_index_and_reads_no_more_at_twice_the_rows(
        db_dsn: str, name: str) -> None:
    """A window of a day ago (no rows) reads the same at 50,000 and 100,000 rows and uses
    its index; the window of every row reads at most EXAMINE_MAX of them."""
    seed(db_dsn, "a")
    now = dt.datetime.now(dt.UTC)
    empty = (now - dt.timedelta(days=2), now - dt.timedelta(days=1))
    before = explain(db_dsn, name, *empty)
    assert f"Index Scan using {INDEXES[name]}" in before or \
        f"Index Only Scan using {INDEXES[name]}" in before, before
    seed(db_dsn, "b")
    after = explain(db_dsn, name, *empty)
    assert total_buffers(after) <= total_buffers(before) * 1.5 + 10, (before, after)
    whole = explain(db_dsn, name, now - dt.timedelta(days=3), now + dt.timedelta(days=1))
    assert "Seq Scan on recording_finalize_attempts" not in whole, whole
    with psycopg.connect(db_dsn) as conn:
        f = incidents.parse_filter(FILTERS[name][0], {"status": FILTERS[name][1]})
        seen = incidents.preview(conn, f)
    assert seen.count <= incidents.SNAPSHOT_MAX and len(seen.sample) <= incidents.SAMPLE
