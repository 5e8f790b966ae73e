"""Withheld rows are held off, not HEADed again every cycle (issue #36): a withheld backlog
larger than one cycle reaches is walked in order until the rows that supply the evidence
— real PostgreSQL, SeaweedFS behind a fault proxy, the S3 worker."""

from __future__ import annotations

import math
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from supervision.app.settings import Config
from supervision.dev.s3 import S3Server
from tests.conftest import make_config
from tests.faults import (
    FaultProxy,
    HttpRequest,
    HttpRule,
    put_recordings,
    s3_object,
    s3_proxy_fixture,
)
from tests.integration.finalize.test_recording_finalize import counts_of, run_cycle
from tests.messenger import fetch, insert_call_session, insert_recording, skip_backoff

s3_proxy = s3_proxy_fixture
ROWS, BATCH, FOUND = 120, 10, 4


@pytest.fixture
def conn(db_dsn: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(db_dsn, autocommit=True) as c:
        yield c


def listing(req: HttpRequest) -> bool:
    return req.method == "GET" and "list-type=2" in req.target


def due_order(conn: psycopg.Connection, ids: list[str]) -> list[dict[str, Any]]:
    """Each row's state, in the order the rows were due."""
    rows = fetch(conn, "SELECT a.recording_id::text AS rid, a.attempts, a.status,"
                       " a.next_attempt_at > now() AS held_off, r.status AS recording"
                       " FROM messenger.recording_finalize_attempts a"
                       " JOIN messenger.call_recordings r ON r.id = a.recording_id"
                       " WHERE a.recording_id = ANY(%s::uuid[])", ids)
    by_id = {r["rid"]: r for r in rows}
    return [by_id[rid] for rid in ids]


async def test_a_backlog_beyond_one_cycle_is_walked_in_order_to_its_last_rows_evidence(
        db_dsn: str, conn: psycopg.Connection, s3_server: S3Server, bucket: str,
        s3_proxy: FaultProxy) -> None:
    """A fresh prefix (nothing listed: ListBucket refused; no recording finalised yet), 120
    due rows of which only the last 4 have a binary, and cycles that reach far fewer rows
    than that (batch_size 10, max_run_duration 1 s, every HEAD held 50 ms). Each cycle
    withholds the rows it reached and holds them off, so the next one goes on behind them
    in due order: no row is HEADed twice and no attempt is spent, and within 120 / 10
    cycles the last rows are reached. Their Found is the evidence: they become Available,
    the 404s of their batch Failed; after the hold-off the next cycle's positive canary
    (one of them) gives every withheld row its Failed verdict."""
    prefix = f"holdoff-{uuid.uuid4().hex[:8]}/"
    sid = insert_call_session(conn, ended_ago=7200)
    ids = [insert_recording(conn, session_id=sid, due_ago=1000.0 - n).id for n in range(ROWS)]
    await put_recordings(s3_server, bucket, ids[-FOUND:], prefix=prefix)
    s3_proxy.rules.append(HttpRule(listing, status=403))
    heads = HttpRule(s3_object("HEAD", prefix=prefix), latency=0.05, hold=True)
    s3_proxy.rules.append(heads)
    cfg: Config = make_config(db_dsn, s3_server=s3_server, bucket=bucket,
                              s3={"endpoint_url": s3_proxy.url, "key_prefix": prefix,
                                  "concurrency": 1},
                              jobs={"recording_finalize": {"batch_size": BATCH,
                                                           "max_run_duration": "1s"}})

    cycles, reached = 0, 0
    while True:
        counts = counts_of(await run_cycle(cfg))
        cycles += 1
        states = due_order(conn, ids)
        touched = [s["held_off"] or s["status"] != "Pending" for s in states]
        assert touched == [True] * sum(touched) + [False] * (ROWS - sum(touched)), (
            "the cycles reach the rows in due order")
        assert sum(touched) > reached, "every cycle goes on behind the last one"
        reached = sum(touched)
        if "reconciled" in counts:
            break
        assert counts == {"withheld": counts["withheld"]}
        assert counts["withheld"] < ROWS - FOUND  # the backlog outlasts a cycle
        assert cycles < math.ceil(ROWS / BATCH), "the last rows are reached in bounded cycles"
    per_key = Counter(req.path.rsplit("/", 1)[1] for req in s3_proxy.seen
                      if req.method == "HEAD" and prefix in req.path)
    assert {per_key[rid] for rid in ids} == {1}, "each row HEADed once, none before its hold-off"
    assert cycles > 1
    assert counts["reconciled"] == FOUND and counts.get("failed", 0) >= 1
    assert {s["attempts"] for s in due_order(conn, ids)[:reached - BATCH]} == {0}

    skip_backoff(db_dsn)  # the hold-off is over
    s3_proxy.rules.remove(heads)
    final = counts_of(await run_cycle(make_config(
        db_dsn, s3_server=s3_server, bucket=bucket,
        s3={"endpoint_url": s3_proxy.url, "key_prefix": prefix})))
    assert "withheld" not in final
    states = due_order(conn, ids)
    assert [s["recording"] for s in states] == ["Failed"] * (ROWS - FOUND) + [
        "Available"] * FOUND
    assert {s["status"] for s in states} == {"Done"}
