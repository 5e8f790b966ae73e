"""Hostile outbox input on real PostgreSQL and Tansu (issue #26): huge rows are dead-lettered
unread with memory bounded, a batch the broker refuses as too large costs only its
offender, a million dead letters stay off the relay's path, and the runbook verbs for dead
letters (list, replay, purge) and `status` are bounded."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
import tomli_w
import trio
from aiokafka import AIOKafkaProducer

from actors.audit.ledger import read_window
from actors.outbox.queries import OUTBOX_QUERIES
from supervision.app.daemon import run_once
from supervision.app.settings import Config
from supervision.dev.kafka import KafkaServer
from supervision.dev.s3 import S3Server
from tests.cli import ROOT
from tests.conftest import make_config
from tests.faults import refuse_batches_over
from tests.integration.db.test_backlog_plans import analyze, buffers
from tests.integration.outbox.test_outbox_relay import enqueue
from tests.messenger import fetch


@pytest.fixture
def topic() -> str:
    return f"test.bounds.{uuid.uuid4().hex[:10]}"


def write_config(tmp_path: Path, db_dsn: str, kafka: KafkaServer, **sections: Any) -> Path:
    config = tmp_path / "c.toml"
    config.write_text(tomli_w.dumps({
        "postgres": {"dsn": db_dsn}, "kafka": {"bootstrap_servers": kafka.bootstrap_servers},
        "logging": {"level": "warning"}, **sections}))
    return config


def cli_peak_rss(config: Path, *args: str) -> tuple[int, str, int]:
    """Run a verb in a child process: its exit code, stdout and peak RSS in bytes."""
    proc = subprocess.Popen([sys.executable, "-m", "supervision.app", *args, "-c", str(config)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            cwd=ROOT, env={"PATH": os.environ.get("PATH", "")})
    assert proc.stdout is not None
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, out, usage.ru_maxrss * 1024


def cli(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "supervision.app", *args, "-c", str(config)],
                          capture_output=True, text=True, cwd=ROOT, check=False,
                          env={"PATH": os.environ.get("PATH", "")})


HUGE = 8  # rows of 40 MB each (compressible: cheap to store, 40 MB once read)


def test_huge_rows_are_dead_lettered_unread_and_relay_memory_stays_bounded(
        db_dsn: str, kafka_server: KafkaServer, topic: str, tmp_path: Path) -> None:
    """Eight 40 MB rows among 30 rows of 600 KB and 100 small ones, with a 4 MiB claim cap:
    run-once publishes every normal row, dead-letters each huge one with its size as the
    reason, and its peak RSS stays within 150 MB of an idle run (fetched whole, the huge
    rows alone were 320 MB of text)."""
    config = write_config(tmp_path, db_dsn, kafka_server,
                          outbox_relay={"claim_max_bytes": 4 * 1024 * 1024})
    code, _, idle_rss = cli_peak_rss(config, "run-once", "--job", "outbox-relay")
    assert code == 0
    enqueue(db_dsn, topic, [f"m{n}" for n in range(30)], 600_000)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO messenger.integration_outbox (topic, message_key, dedupe_key,"
            " event_type, payload) SELECT %s, 'huge' || g, 'huge' || g, 'Test',"
            " jsonb_build_object('blob', repeat('x', 40000000)) FROM generate_series(1, %s) g",
            (topic, HUGE))
    enqueue(db_dsn, topic, [f"s{n % 10}" for n in range(100)])
    code, out, rss = cli_peak_rss(config, "run-once", "--job", "outbox-relay")
    assert code == 0, out
    counts = json.loads(out)
    assert counts["published"] == 130 and counts["failed"] == HUGE
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        dead = fetch(conn, "SELECT d.reason, o.last_error FROM safetynet.outbox_dead_letters d"
                           " JOIN messenger.integration_outbox o ON o.id = d.outbox_id")
        waiting = fetch(conn, "SELECT id FROM messenger.integration_outbox"
                              " WHERE published_at IS NULL AND message_key NOT LIKE 'huge%%'")
    assert len(dead) == HUGE and waiting == []
    assert all(d["reason"].startswith("too_large: row of 400000") for d in dead), dead
    assert all(d["last_error"].startswith("dead-letter: too_large") for d in dead)
    assert rss - idle_rss < 150 * 1024 * 1024, (rss, idle_rss)


async def test_a_batch_refused_as_too_large_is_resent_one_by_one(
        db_dsn: str, kafka_server: KafkaServer, s3_server: S3Server, topic: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A broker whose message.max.bytes (200 KB) is below the client's max request size
    refuses every batch over it whole: each is sent again one message per batch, so only
    the one 300 KB row is dead-lettered and its 19 batch-mates of 30 KB are published."""
    refused = refuse_batches_over(monkeypatch, 200_000)
    small = await trio.to_thread.run_sync(enqueue, db_dsn, topic,
                                          [f"k{n}" for n in range(10)], 30_000)
    big = await trio.to_thread.run_sync(lambda: enqueue(db_dsn, topic, ["big"], 300_000))
    small += await trio.to_thread.run_sync(enqueue, db_dsn, topic,
                                           [f"k{n}" for n in range(10, 19)], 30_000)
    cfg: Config = make_config(db_dsn, kafka_server=kafka_server, s3_server=s3_server)
    counts = await run_once(cfg, "outbox-relay")
    assert any(n > 1 for n in refused), "no batch was refused whole: nothing was tested"
    assert counts["published"] == 19 and counts["failed"] == 1
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        dead = fetch(conn, "SELECT outbox_id, reason FROM safetynet.outbox_dead_letters")
    assert [(d["outbox_id"], d["reason"]) for d in dead] == [
        (big[0], "kafka:MessageSizeTooLargeError")]


MILLION = 1_000_000
DEAD = """
WITH rows AS (
    INSERT INTO messenger.integration_outbox (topic, message_key, dedupe_key, event_type,
        payload, publish_attempts, last_error, created_at)
    SELECT 't.dead', 'k' || g, 'd' || g, 'Test', '{}', 1,
           'dead-letter: kafka:MessageSizeTooLargeError', now() - interval '1 day'
    FROM generate_series(1, %(rows)s) g
    RETURNING id, topic, message_key
)
INSERT INTO safetynet.outbox_dead_letters (outbox_id, topic, message_key, reason, blocks_key,
    created_at)
SELECT id, topic, message_key, 'kafka:MessageSizeTooLargeError', false, now() - interval '1 day'
FROM rows
"""


def test_a_million_dead_letters_stay_off_the_relay_path(
        db_dsn: str, kafka_server: KafkaServer, tmp_path: Path) -> None:
    """A million dead letters and 5 rows waiting: the idle probe, the claim and the
    unpublished count of outbox_stats read a few buffers through ix_outbox_live (they
    walked every dead letter: 574 ms, 738 ms, over 10 minutes), and `safetynet status`
    answers under a 5 s statement timeout with the counts."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute(DEAD, {"rows": MILLION})
        conn.execute("VACUUM ANALYZE messenger.integration_outbox,"
                     " safetynet.outbox_dead_letters")
    ids = enqueue(db_dsn, "t.live", [f"l{n}" for n in range(5)])
    claim = {"batch_size": 500, "held_topics": [], "after_id": 0, "skip": [],
             "max_bytes": 16 << 20, "max_row_bytes": 1 << 20}
    read = {}
    with psycopg.connect(db_dsn) as conn:
        for name, params in (("outbox_has_publishable", {}), ("outbox_claim_batch", claim),
                             ("outbox_stats", {})):
            if name == "outbox_claim_batch":  # the claim as the claimer runs it
                conn.execute(OUTBOX_QUERIES["outbox_claim_plan"])
            plan = analyze(conn, name, params)
            conn.rollback()
            assert "ix_outbox_live" in plan and "Seq Scan on integration_outbox" not in plan, plan
            live = plan[plan.index("ix_outbox_live"):]
            read[name] = buffers(live[:live.index("Buffers:") + 80])
        claimed = conn.execute(OUTBOX_QUERIES["outbox_claim_batch"], claim).fetchall()
        conn.rollback()
    assert [r[0] for r in claimed] == ids
    assert all(n < 50 for n in read.values()), read
    config = write_config(tmp_path, db_dsn, kafka_server,
                          postgres={"dsn": db_dsn, "statement_timeout": "5s"})
    started = time.monotonic()
    proc = cli(config, "status", "--json")
    assert proc.returncode in (0, 2), proc.stderr
    outbox = json.loads(proc.stdout)["outbox"]
    assert (outbox["unpublished"], outbox["dead_lettered"], outbox["blocked_keys"]) == (
        5, MILLION, 0)
    assert time.monotonic() - started < 30


def test_replay_puts_a_dead_letter_back_and_purge_deletes_old_ones(
        db_dsn: str, kafka_server: KafkaServer, topic: str, tmp_path: Path) -> None:
    """`dead-letters` lists them; `replay` of an unknown id changes nothing (exit 2); a
    replayed row is published by the next run-once; `dead-letters --purge` deletes the
    ones past the age with their outbox rows, but keeps one that blocks its key."""
    config = write_config(tmp_path, db_dsn, kafka_server,  # the relay purges none itself
                          outbox_relay={"dead_letter_retention": "365d"})
    ids = enqueue(db_dsn, topic, ["a", "b", "c", "c"])
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        for outbox_id in ids[:3]:  # c's first row blocks c's second
            conn.execute(OUTBOX_QUERIES["outbox_dead_letter"],
                         {"id": outbox_id, "reason": "kafka:X"})
        conn.execute("UPDATE safetynet.outbox_dead_letters SET created_at = now() -"
                     " interval '40 days' WHERE outbox_id <> %s", (ids[0],))
    listed = cli(config, "dead-letters", "--json")
    assert listed.returncode == 0, listed.stderr
    found = json.loads(listed.stdout)
    assert found["total"] == 3
    assert {r["outbox_id"]: r["blocking"] for r in found["newest"]} == {
        ids[0]: False, ids[1]: False, ids[2]: True}
    unknown = cli(config, "replay", str(ids[0]), "999999", "--reason", "test")
    assert unknown.returncode == 2 and "999999" in unknown.stderr
    replayed = cli(config, "replay", str(ids[0]), "--reason", "broker limit raised")
    assert replayed.returncode == 0, replayed.stderr
    assert "replayed" in replayed.stdout
    run = cli(config, "run-once", "--job", "outbox-relay")
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["published"] == 1
    purged = cli(config, "dead-letters", "--purge", "--older-than", "30d", "--reason", "old",
                 "--json")
    assert purged.returncode == 0, purged.stderr
    assert json.loads(purged.stdout)["purged"] == 1
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        left = fetch(conn, "SELECT id, published_at IS NOT NULL AS published"
                           " FROM messenger.integration_outbox ORDER BY id")
        dead = [r["outbox_id"] for r in fetch(conn, "SELECT outbox_id FROM"
                                                    " safetynet.outbox_dead_letters")]
    assert [(r["id"], r["published"]) for r in left] == [
        (ids[0], True), (ids[2], False), (ids[3], False)]
    assert dead == [ids[2]]


def test_status_gives_up_at_the_daemons_lock_timeout(
        db_dsn: str, kafka_server: KafkaServer, tmp_path: Path) -> None:
    """With the outbox table locked exclusively by another session, `safetynet status`
    exits 1 within seconds (the daemon's lock and statement timeouts) instead of hanging."""
    config = write_config(tmp_path, db_dsn, kafka_server, postgres={
        "dsn": db_dsn, "statement_timeout": "2s", "lock_timeout": "1s"})
    with psycopg.connect(db_dsn) as holder:
        holder.execute("LOCK TABLE messenger.integration_outbox IN ACCESS EXCLUSIVE MODE")
        started = time.monotonic()
        proc = cli(config, "status")
        elapsed = time.monotonic() - started
        holder.rollback()
    assert proc.returncode == 1 and "lock timeout" in proc.stderr, proc.stderr
    assert elapsed < 20


async def test_audit_kafka_read_is_bounded_by_bytes(
        kafka_server: KafkaServer, s3_server: S3Server, db_dsn: str, topic: str) -> None:
    """Five 100 KB messages on a topic: a read bounded at 250,000 bytes stops incomplete,
    saying so; bounded at 10 MB it reads them all."""
    async def produce() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=kafka_server.bootstrap_servers)
        await producer.start()
        try:
            for n in range(5):
                await producer.send_and_wait(topic, b"x" * 100_000, key=f"k{n}".encode())
        finally:
            await producer.stop()

    cfg = make_config(db_dsn, kafka_server=kafka_server, s3_server=s3_server)

    def read(max_bytes: int) -> Any:
        return asyncio.run(read_window(cfg.kafka, [topic], 0, max_messages=1000,
                                       timeout_s=20, max_bytes=max_bytes))

    await trio.to_thread.run_sync(lambda: asyncio.run(produce()))
    small = await trio.to_thread.run_sync(read, 250_000)
    assert not small.complete and small.why == "window holds more than 250000 bytes"
    whole = await trio.to_thread.run_sync(read, 10_000_000)
    assert whole.complete and len(whole.ledger.entries) == 5


def test_the_relay_purges_dead_letters_past_retention_but_keeps_a_blocking_one(
        db_dsn: str, kafka_server: KafkaServer, topic: str, tmp_path: Path) -> None:
    """Dead letters 40 days old under a 30-day retention: the relay's retention pass
    deletes the one that blocks nothing together with its row, keeps the one that still
    holds back a later row of its key, and leaves a fresh one alone."""
    config = write_config(tmp_path, db_dsn, kafka_server,
                          outbox_relay={"dead_letter_retention": "30d"})
    ids = enqueue(db_dsn, topic, ["a", "b", "b", "c"])
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        for outbox_id in (ids[0], ids[1], ids[3]):  # b's first row blocks b's second
            conn.execute(OUTBOX_QUERIES["outbox_dead_letter"],
                         {"id": outbox_id, "reason": "kafka:X"})
        conn.execute("UPDATE safetynet.outbox_dead_letters SET created_at = now() -"
                     " interval '40 days' WHERE outbox_id <> %s", (ids[3],))
    run = cli(config, "run-once", "--job", "outbox-relay")
    assert run.returncode == 0, run.stderr
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        rows = [r["id"] for r in fetch(conn, "SELECT id FROM messenger.integration_outbox"
                                             " ORDER BY id")]
        dead = [r["outbox_id"] for r in fetch(conn, "SELECT outbox_id FROM"
                                                    " safetynet.outbox_dead_letters"
                                                    " ORDER BY outbox_id")]
    assert rows == ids[1:] and dead == [ids[1], ids[3]]
