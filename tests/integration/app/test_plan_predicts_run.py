"""`safetynet plan --job recording-finalize --json` predicts the run row by row (issue #36):
random mixed backlogs (found, missing with and without evidence, octet-stream objects,
terminal, waiting and poison rows, rows and recordings another transaction holds) under
each way a cycle can go (evidence from the start or not, object storage down, a missing
bucket, a HEAD refused mid-cycle, the job paused), planned and then run on real
PostgreSQL and SeaweedFS behind a fault proxy; the run's per-row decisions are read from
the rows' resulting state and its counts."""

from __future__ import annotations

import json
import random
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
import pytest
import tomli_w
import trio

from supervision.app.daemon import run_once
from supervision.dev.s3 import S3Server
from tests.cli import cli
from tests.conftest import make_config
from tests.faults import FaultProxy, HttpRequest, HttpRule, put_recordings, s3_object
from tests.faults import s3_proxy_fixture as s3_proxy  # noqa: F401 (a fixture)
from tests.messenger import (
    fetch,
    insert_attempt,
    insert_call_session,
    insert_recording,
)

BATCH = 4
KINDS = ("found", "missing", "missing", "octet", "republish", "closed", "wait", "orphan")
MODES = ("no_evidence", "evidence", "octet_everywhere", "s3_down", "bucket_missing",
         "head_refused", "paused")
SEEDS = (1, 2)
LATER = "later (attempt kept)"  # rescheduled, withheld or held off: due again later
UNTOUCHED = "untouched"
# what the run leaves of a row, by the plan's decision
EXPECTED = {
    "Available + event": "Available + event", "Failed/Timeout": "Failed/Timeout",
    "enqueue event, close row": "enqueue event, close row", "close row": "close row",
    "quarantine": "quarantine", "retry after back-off": "retry after back-off",
    "reschedule (not an attempt)": LATER, "withheld (given back untouched)": LATER,
    "deferred (given back untouched)": UNTOUCHED, "nothing (object storage down)": UNTOUCHED,
    "skipped (held by another transaction)": UNTOUCHED, "nothing (job paused)": UNTOUCHED,
}


def listing(req: HttpRequest) -> bool:
    return req.method == "GET" and "list-type=2" in req.target


async def seed(conn: psycopg.Connection, s3_server: S3Server, bucket: str, prefix: str,
               rnd: random.Random, mode: str) -> list[str]:
    """A shuffled backlog of every kind, due one second apart (claim order = list order)."""
    kinds = [rnd.choice(KINDS) for _ in range(rnd.randint(10, 22))]
    if mode == "octet_everywhere":
        kinds = [rnd.choice(("octet", "octet", "missing")) for _ in kinds]
    ended, live = insert_call_session(conn, ended_ago=7200), insert_call_session(conn,
                                                                                 ended_ago=None)
    ids, found, octet = [], [], []
    for n, kind in enumerate(kinds):
        due = 5000.0 - n
        if kind == "orphan":
            rid = str(uuid.uuid4())
            insert_attempt(conn, rid, ended, due_ago=due)
        else:
            status = {"republish": "Available", "closed": "Failed"}.get(kind, "Uploading")
            rid = insert_recording(conn, session_id=live if kind == "wait" else ended,
                                   status=status, due_ago=due).id
        ids.append(rid)
        (found if kind == "found" else octet if kind == "octet" else []).append(rid)
    await put_recordings(s3_server, bucket, found, prefix=prefix)
    await put_recordings(s3_server, bucket, octet, prefix=prefix,
                         content_type="application/octet-stream")
    if mode == "evidence":  # a recording finalised earlier: the positive canary finds it
        rid = insert_recording(conn, session_id=ended, status="Available",
                               with_attempt=False).id
        insert_attempt(conn, rid, ended, status="Done")
        await put_recordings(s3_server, bucket, [rid], prefix=prefix)
    return ids


def state(conn: psycopg.Connection, ids: list[str]) -> dict[str, dict[str, Any]]:
    rows = fetch(conn, "SELECT a.recording_id::text AS rid, a.status, a.attempts,"
                       " a.next_attempt_at > now() AS later, r.status AS recording,"
                       " EXISTS (SELECT 1 FROM messenger.integration_outbox o"
                       "         WHERE o.dedupe_key = a.recording_id::text) AS event"
                       " FROM messenger.recording_finalize_attempts a"
                       " LEFT JOIN messenger.call_recordings r ON r.id = a.recording_id"
                       " WHERE a.recording_id = ANY(%s::uuid[])", ids)
    return {r["rid"]: r for r in rows}


def run_decision(before: dict[str, Any], after: dict[str, Any]) -> str:
    """What the run did with a row, read from its state before and after."""
    if after["status"] == "Quarantined":
        return "quarantine"
    if after["status"] == "Done":
        if after["recording"] != before["recording"]:
            return {"Available": "Available + event", "Failed": "Failed/Timeout"}[
                after["recording"]]
        return "enqueue event, close row" if after["event"] > before["event"] else "close row"
    if after["attempts"] == before["attempts"] + 1:
        return "retry after back-off"
    assert after["attempts"] == before["attempts"]
    return LATER if after["later"] else UNTOUCHED


def expected(item: dict[str, str]) -> str:
    if item["decision"] == "nothing (configuration fault)":  # held off, or untouched
        return LATER if "next HEAD in" in item["why"] else UNTOUCHED
    return EXPECTED[item["decision"]]


def config_file(tmp_path: Path, db_dsn: str, s3_server: S3Server, bucket: str,
                proxy: FaultProxy, prefix: str) -> Path:
    creds = s3_server.credentials
    path = tmp_path / "c.toml"
    path.write_text(tomli_w.dumps({
        "postgres": {"dsn": db_dsn},
        "s3": {"endpoint_url": proxy.url, "bucket": bucket, "key_prefix": prefix,
               "access_key_id": creds.access_key_id, "concurrency": 1,
               "secret_access_key": creds.secret_access_key},
        "jobs": {"recording_finalize": {"batch_size": BATCH}},
        "logging": {"level": "warning"}}))
    return path


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("seed_", SEEDS)
async def test_plan_json_names_the_run_s_decision_for_every_row(
        db_dsn: str, s3_server: S3Server, bucket: str, s3_proxy: FaultProxy,  # noqa: F811
        tmp_path: Path, seed_: int, mode: str) -> None:
    """For a random backlog and a way the cycle goes: every row `plan --json` lists gets,
    from run-once right after, exactly the decision the plan named, and the run's counts
    of withheld, rescheduled, quarantined, reconciled and failed rows are the plan's."""
    rnd = random.Random(seed_)
    prefix = f"plan-{uuid.uuid4().hex[:8]}/"
    s3_proxy.rules.append(HttpRule(listing, status=403))  # no evidence from a listing
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        ids = await seed(conn, s3_server, bucket, prefix, rnd, mode)
        held_rows, held_recordings = rnd.sample(ids, 2), rnd.sample(ids, 2)
        before = state(conn, ids)
    bucket_of = f"no-such-bucket-{uuid.uuid4().hex[:6]}" if mode == "bucket_missing" else bucket
    config = config_file(tmp_path, db_dsn, s3_server, bucket_of, s3_proxy, prefix)
    if mode == "s3_down":
        s3_proxy.down = True
    if mode == "head_refused":  # every object from a row of the last claim on answers 403
        claimable = [rid for rid in ids if rid not in held_rows]
        last = (len(claimable) - 1) // BATCH * BATCH  # no claim after it left unmade
        refused = {f"{prefix}{rid}"
                   for rid in claimable[rnd.randrange(last, len(claimable)):]}
        s3_proxy.rules.append(HttpRule(s3_object("HEAD", prefix=prefix, keys=refused),
                                       status=403))
    if mode == "paused":
        assert cli(config, "pause", "--job", "recording-finalize",
                   "--reason", "INC-3").returncode == 0
    with psycopg.connect(db_dsn) as holder:  # another transaction holds these rows
        holder.execute("SELECT 1 FROM messenger.recording_finalize_attempts"
                       " WHERE recording_id = ANY(%s::uuid[]) FOR UPDATE", (held_rows,))
        holder.execute("SELECT 1 FROM messenger.call_recordings"
                       " WHERE id = ANY(%s::uuid[]) FOR UPDATE", (held_recordings,))
        plan = await trio.to_thread.run_sync(
            cli, config, "plan", "--job", "recording-finalize", "--json")
        assert plan.returncode == 0, plan.stderr
        try:
            counts = await run_once(make_config(
                db_dsn, s3_server=s3_server, bucket=bucket_of,
                s3={"endpoint_url": s3_proxy.url, "key_prefix": prefix, "concurrency": 1},
                jobs={"recording_finalize": {"batch_size": BATCH}}), "recording-finalize")
        except Exception:  # a paused job or a missing bucket: no cycle ran
            assert mode in ("paused", "bucket_missing")
            counts = {}
        holder.rollback()
    items = {i["id"]: i for i in map(json.loads, plan.stdout.splitlines())}
    assert sorted(items) == sorted(ids)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        after = state(conn, ids)
    ran = {rid: run_decision(before[rid], after[rid]) for rid in ids}
    assert {rid: ran[rid] for rid in ids} == {rid: expected(items[rid]) for rid in ids}, (
        mode, [(items[rid]["decision"], items[rid]["why"]) for rid in ids])
    planned = Counter(i["decision"] for i in items.values())
    assert {k: counts.get(k, 0) for k in ("withheld", "rescheduled", "reconciled", "failed",
                                          "quarantined")} == {
        "withheld": planned["withheld (given back untouched)"],
        "rescheduled": planned["reschedule (not an attempt)"],
        "reconciled": planned["Available + event"],
        "failed": planned["Failed/Timeout"], "quarantined": planned["quarantine"]}
