"""The claim's plan does not rest on fresh statistics (issue 37 item 6): a burst committed
into an idle outbox, before autoanalyze has seen it, is claimed through ``ix_outbox_live``
in id order, 500 rows at a time, not by reading and sorting every live row."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from actors.outbox.claimer import claim_batch
from actors.outbox.queries import OUTBOX_QUERIES
from tests.integration.db.test_backlog_plans import buffers

BURST = 20_000
WRITE_BURST = """
INSERT INTO messenger.integration_outbox (topic, message_key, dedupe_key, event_type,
    payload, headers)
SELECT 't.burst', 'k' || (g %% 1000), 'd' || g, 'Test',
       jsonb_build_object('N', g, 'Pad', repeat('x', 600)),
       jsonb_build_object('event-type', 'Test', 'event-id', 'e' || g)
FROM generate_series(1, %(rows)s) g
"""
CLAIM = {"batch_size": 500, "held_topics": [], "skip": [], "max_bytes": 16 << 20,
         "max_row_bytes": 1 << 20}


def explain(conn: psycopg.Connection, params: dict[str, Any], pinned: bool) -> str:
    """The claim's plan as run (EXPLAIN ANALYZE, BUFFERS), with or without the claim's
    own plan settings, in a transaction rolled back."""
    with conn.transaction(force_rollback=True):
        if pinned:
            conn.execute(OUTBOX_QUERIES["outbox_claim_plan"])
        return "\n".join(r[0] for r in conn.execute(
            b"EXPLAIN (ANALYZE, BUFFERS) " + OUTBOX_QUERIES["outbox_claim_batch"].encode(),
            params).fetchall())


def live_buffers(plan: str) -> int:
    """The buffers the scan of ix_outbox_live (and its heap) read."""
    live = plan[plan.index("using ix_outbox_live"):]
    return buffers(live[:live.index("Buffers:") + 80])


def claimed_part(plan: str) -> str:
    """The plan of the claim's CTE (what the LIMIT sits on), up to the byte cap's part."""
    return plan[plan.index("CTE claimed"):plan.index("Subquery Scan on s")]


@pytest.fixture(params=["analyzed-while-empty", "never-analyzed"])
def burst(db_dsn: str, request: pytest.FixtureRequest) -> int:
    """An idle outbox whose statistics say it is empty (analyzed while empty, or never),
    the activity counters reset, then a burst: the first id of the burst."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE messenger.integration_outbox CASCADE")
        if request.param == "analyzed-while-empty":
            conn.execute("ANALYZE messenger.integration_outbox")
        conn.execute("SELECT pg_stat_reset()")
        conn.execute(WRITE_BURST, {"rows": BURST})
        row = conn.execute("SELECT min(id) FROM messenger.integration_outbox").fetchone()
        assert row is not None
        return int(row[0])


@pytest.mark.parametrize("where", ["from-the-start", "behind-a-backlog", "skipping-1000"])
def test_a_burst_into_an_idle_outbox_is_claimed_through_the_index_in_id_order(
        db_dsn: str, burst: int, where: str) -> None:
    """Under the statistics of an empty table the claim walks ix_outbox_live in id order
    with no sort under its LIMIT and reads a few hundred buffers for it (without the claim's
    plan settings, the premise: every live row read and sorted), and claims the first 500
    rows."""
    params = {**CLAIM, "after_id": burst + 5_000 if where == "behind-a-backlog" else 0,
              "skip": list(range(burst, burst + 1000)) if where == "skipping-1000" else []}
    with psycopg.connect(db_dsn) as conn:
        unpinned = claimed_part(explain(conn, params, pinned=False))
        pinned = claimed_part(explain(conn, params, pinned=True))
        with conn.transaction(force_rollback=True):
            rows = claim_batch(conn, 500, (), params["after_id"], params["skip"]).rows
    assert "Sort Key: o_1.id" in unpinned, unpinned  # the statistics mislead the planner
    assert "Index Scan using ix_outbox_live" in pinned, pinned
    assert "Sort" not in pinned and "Bitmap" not in pinned, pinned
    assert live_buffers(pinned) < 300 and buffers(unpinned) > BURST // 10, pinned
    first = max(params["after_id"] + 1, burst + len(params["skip"]))
    assert [row.id for row in rows] == list(range(first, first + 500))
