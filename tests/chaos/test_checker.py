"""The checker can fail: a converged database and its Kafka ledger pass; then each kind of
corruption is planted (in the database, or in a copy of the ledger) and the checker — the
function and `python -m tests.chaos.checker` — must report every one of them; so must the
shipped `safetynet audit` (exit 2, --json; its S3 HEADs find the Failed-with-object one),
which finds nothing on the converged database (exit 0, also with --kafka). The delivery
judgement both relay sources share (the Kafka read-back, redeliveries and their bound) is
checked on hand-made ledgers, without servers."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import attrs
import psycopg
import pytest

from actors.envelope import TOPIC_CONFERENCE_ENDED, TOPIC_RECORDING_AVAILABLE, event_id
from supervision.dev.kafka import KafkaServer
from supervision.dev.s3 import S3Server
from tests.chaos.checker import (
    Violation,
    check,
    check_delivery,
    outside_windows,
    redeliveries,
    redelivery_bound,
    slot_unread,
    summary,
)
from tests.chaos.conftest import LIMITS, Run
from tests.chaos.daemon import (
    ROOT,
    Daemon,
    Daemons,
    audit_cli,
    audit_config,
    daemon_config,
    seed,
    wait_settled,
)
from tests.chaos.ledger import Entry, Ledger, read_ledger
from tests.chaos.report import record

pytestmark = pytest.mark.chaos

CLI_LIMITS = ["--sla", "0s", "--slack", "0s", "--empty-room-grace", "5s",
              "--provision-timeout", "5s", "--stale-live-timeout", "1m"]


def cli(dsn: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tests.chaos.checker", "--dsn", dsn,
                           *CLI_LIMITS], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, check=False)


def test_checker_reports_every_planted_corruption(
        run: Run, daemons: Daemons, s3_server: S3Server, bucket: str,
        kafka_server: KafkaServer, tmp_path: Path) -> None:
    dsn = run.dsn
    run.uploaded = seed(dsn, s3_server, bucket, recordings=60, conferences=12, deals=2)
    run.begin_kafka(kafka_server.bootstrap_servers)
    cfg = daemon_config(dsn, s3_url=s3_server.endpoint_url, s3=s3_server, bucket=bucket,
                        kafka=kafka_server.bootstrap_servers)
    daemon = daemons.add(Daemon(tmp_path, "d1", cfg)).start()
    wait_settled(dsn, relay=True, limit_s=60, daemons=daemons)
    daemon.terminate()
    with psycopg.connect(dsn, autocommit=True) as conn:
        expect = [event_id(t, d) for t, d in conn.execute(
            "SELECT topic, dedupe_key FROM messenger.integration_outbox").fetchall()]
        subjects = {str(r[0]) for r in conn.execute(
            "SELECT id FROM messenger.call_recordings UNION ALL"
            " SELECT id FROM messenger.conference_sessions")}
    # this test's events only (as Run.verify reads them): the session's broker carries the
    # earlier tests' too, and Tansu may answer a stale end offset for where they end
    ledger = read_ledger(kafka_server.bootstrap_servers, expect=expect,
                         since=run.since).about(subjects)
    clean = check(dsn, ledger=ledger, uploaded=run.uploaded, limits=LIMITS)
    assert clean == []
    clean_cli = cli(dsn)
    assert (clean_cli.returncode, clean_cli.stdout.strip()) == (0, "ok"), clean_cli.stderr
    shipped = audit_config(tmp_path, cfg)
    clean_audit = audit_cli(shipped, "--json", "--kafka")
    assert clean_audit.returncode == 0, clean_audit.stdout + clean_audit.stderr
    assert json.loads(clean_audit.stdout)["violations"] == []

    planted = plant_database_corruptions(dsn, run.uploaded)
    bad_ledger, ledger_planted = corrupt_ledger(ledger, dsn)
    planted.update(ledger_planted)
    found = check(dsn, ledger=bad_ledger, uploaded=run.uploaded, limits=LIMITS)
    missed = {inv: subject for inv, subject in planted.items()
              if not any(v.invariant == inv and v.subject == subject for v in found)}
    bad_cli = cli(dsn)
    db_planted = {k: v for k, v in planted.items() if k not in ledger_planted}
    cli_missed = [f"{inv}: {subj}" for inv, subj in db_planted.items()
                  if inv != "failed_with_object" and f"{inv}: {subj}" not in bad_cli.stdout]
    bad_audit = audit_cli(shipped, "--json")
    reported = {(v["invariant"], v["subject"])
                for v in json.loads(bad_audit.stdout)["violations"]}
    audit_missed = [f"{inv}: {subj}" for inv, subj in db_planted.items()
                    if (inv, subj) not in reported]
    record(run.name, title="The checker can fail",
           proves="each planted corruption (lost, duplicated, wrong verdict, unbounded,"
                  " out of order, inconsistent or missing on Kafka) is reported",
           injected=sorted(planted), rows={"planted": len(planted),
                                           "violations reported": len(found)},
           faults=len(planted), invariants={"corruption_missed": len(missed),
                                            "cli_missed": len(cli_missed),
                                            "cli_exit_not_1": int(bad_cli.returncode != 1),
                                            "audit_missed": len(audit_missed),
                                            "audit_exit_not_2": int(bad_audit.returncode != 2)},
           duration_s=time.monotonic() - run.started,
           reported=dict(sorted((k, v) for k, v in summary(found).items() if v)))
    assert missed == {}, found
    assert bad_cli.returncode == 1 and cli_missed == [], bad_cli.stdout
    assert bad_audit.returncode == 2 and audit_missed == [], bad_audit.stdout


def plant_database_corruptions(dsn: str, uploaded: set[str]) -> dict[str, str]:
    """One corruption per invariant, each on its own row; {invariant: subject}."""
    planted: dict[str, str] = {}
    with psycopg.connect(dsn, autocommit=True) as conn:
        def one(query: str, *params: object) -> str:
            row = conn.execute(query, params or None).fetchone()
            assert row is not None, query
            return str(row[0])

        available = [str(r[0]) for r in conn.execute(
            "SELECT r.id FROM messenger.call_recordings r WHERE status = 'Available'"
            " ORDER BY id").fetchall()]
        with_object = [r for r in available if r in uploaded]
        others = with_object[6:]  # Available, untouched by the corruptions on [0:6]
        # lost: an outbox row deleted (the transition without its event)
        rid = with_object[0]
        conn.execute("DELETE FROM messenger.integration_outbox WHERE dedupe_key = %s", (rid,))
        planted["missing_outbox"] = rid
        # lost: a recording back in Uploading after its session ended
        rid = with_object[1]
        conn.execute("UPDATE messenger.call_recordings SET status = 'Uploading'"
                     " WHERE id = %s", (rid,))
        planted["lost_recording"] = rid
        # wrong verdict: a recording whose object is in S3 marked Failed
        rid = with_object[2]
        conn.execute("UPDATE messenger.call_recordings SET status = 'Failed',"
                     " failure_reason = 'Timeout' WHERE id = %s", (rid,))
        planted["failed_with_object"] = rid
        planted["unexpected_outbox"] = rid  # ... while its event says Available
        # duplicated: a second realtime row (the transition done twice)
        rid = with_object[3]
        conn.execute("INSERT INTO messenger.realtime_outbox (kind, target_kind, chat_id,"
                     " session_kind, reference_id, payload) SELECT kind, target_kind, chat_id,"
                     " session_kind, reference_id, payload FROM messenger.realtime_outbox"
                     " WHERE reference_id = %s", (rid,))
        planted["duplicate_realtime"] = rid
        # duplicated: a second outbox row for one dedupe key (past the unique index)
        rid = others[0]
        conn.execute("DROP INDEX messenger.ux_outbox_dedupe")
        conn.execute("INSERT INTO messenger.integration_outbox (topic, message_key,"
                     " dedupe_key, event_type, payload, headers, published_at) SELECT topic,"
                     " message_key, dedupe_key, event_type, payload, headers, published_at"
                     " FROM messenger.integration_outbox WHERE dedupe_key = %s", (rid,))
        planted["duplicate_outbox"] = f"{TOPIC_RECORDING_AVAILABLE}/{rid}"
        # lost: a realtime row of a Failed recording deleted
        failed = one("SELECT id FROM messenger.call_recordings WHERE status = 'Failed'"
                     " AND id <> %s ORDER BY id LIMIT 1", planted["failed_with_object"])
        conn.execute("DELETE FROM messenger.realtime_outbox WHERE reference_id = %s",
                     (failed,))
        planted["missing_realtime"] = failed
        # lost: an event never published
        rid = others[1]
        oid = one("UPDATE messenger.integration_outbox SET published_at = NULL"
                  " WHERE dedupe_key = %s RETURNING id", rid)
        planted["unpublished"] = oid
        # lost: a due conference back to Active
        cid = one("UPDATE messenger.conference_sessions SET status = 'Active',"
                  " end_reason = NULL WHERE id = (SELECT id FROM messenger.conference_sessions"
                  " WHERE end_reason = 'EmptyTimeout' ORDER BY id LIMIT 1) RETURNING id")
        planted["lost_conference"] = cid
        # bounded: attempts beyond max_attempts, and an early s3 quarantine
        rid = one("UPDATE messenger.recording_finalize_attempts SET attempts = 9"
                  " WHERE recording_id = %s RETURNING recording_id", with_object[4])
        planted["attempts_exceeded"] = rid
        rid = one("UPDATE messenger.recording_finalize_attempts SET status = 'Quarantined',"
                  " attempts = 3, last_error = 's3:Timeout' WHERE recording_id = %s"
                  " RETURNING recording_id", with_object[5])
        planted["quarantine_early"] = rid
    return planted


def corrupt_ledger(ledger: Ledger, dsn: str) -> tuple[Ledger, dict[str, str]]:
    """A copy of *ledger* with one event missing, one redelivered with another payload, one
    key's two events swapped, and an unknown event id."""
    entries = list(ledger.entries)
    planted: dict[str, str] = {}
    with psycopg.connect(dsn, autocommit=True) as conn:
        published = {event_id(t, d) for t, d in conn.execute(
            "SELECT topic, dedupe_key FROM messenger.integration_outbox"
            " WHERE published_at IS NOT NULL AND topic = %s", (TOPIC_RECORDING_AVAILABLE,))}
    candidates = sorted(e.event_id for e in entries
                        if e.event_id in published and e.topic == TOPIC_RECORDING_AVAILABLE)
    gone = candidates[0]
    entries = [e for e in entries if e.event_id != gone]
    planted["not_in_ledger"] = str(gone)
    twice = next(e for e in entries if e.event_id == candidates[1])
    entries.append(attrs.evolve(twice, offset=10**9, payload={**twice.payload, "FileId": "x"}))
    planted["ledger_inconsistent"] = str(twice.event_id)
    conf = [e for e in entries if e.topic == TOPIC_CONFERENCE_ENDED]
    by_key: dict[str | None, list[int]] = {}
    for i, e in enumerate(entries):
        if e.topic == TOPIC_CONFERENCE_ENDED:
            by_key.setdefault(e.key, []).append(i)
    key, idx = next((k, v) for k, v in by_key.items() if len(v) >= 2)
    a, b = idx[0], idx[1]
    entries[a], entries[b] = (attrs.evolve(entries[a], offset=entries[b].offset),
                              attrs.evolve(entries[b], offset=entries[a].offset))
    planted["order"] = f"{TOPIC_CONFERENCE_ENDED}/{key}"
    entries.append(attrs.evolve(conf[0], event_id="00000000-0000-0000-0000-000000000000",
                                offset=10**9 + 1))
    planted["unknown_event"] = "00000000-0000-0000-0000-000000000000"
    return Ledger(entries), planted


def test_violation_prints_its_invariant_first() -> None:
    assert str(Violation("order", "t/k", "[2, 1]")) == "order: t/k [2, 1]"


# ------------------------------------------------------------------ delivery, pure

TOPIC = TOPIC_CONFERENCE_ENDED


def outbox_rows(*keys: str) -> list[tuple[object, ...]]:
    """Outbox rows (id, topic, key, dedupe_key, payload), ids 1.. in order, as the logical
    source leaves them: no published_at anywhere."""
    return [(n, TOPIC, key, f"conf-{n}", {"ConferenceId": f"conf-{n}"})
            for n, key in enumerate(keys, start=1)]


def delivered(rows: list[tuple[object, ...]], *order: int) -> Ledger:
    """A ledger holding the rows of outbox ids *order*, in that offset order."""
    by_id = {row[0]: row for row in rows}
    return Ledger([Entry(TOPIC, 0, offset, str(by_id[oid][2]),
                         event_id(TOPIC, str(by_id[oid][3])), by_id[oid][4])
                   for offset, oid in enumerate(order)])


def test_every_row_delivered_once_is_clean_and_counts_no_duplicate() -> None:
    rows = outbox_rows("a", "b", "a")
    ledger = delivered(rows, 1, 2, 3)
    assert check_delivery(rows, ledger) == []
    assert (redeliveries(ledger).events, redeliveries(ledger).copies) == (0, 0)


def test_an_event_delivered_twice_is_counted_and_not_a_violation() -> None:
    rows = outbox_rows("a", "b", "a")
    ledger = delivered(rows, 1, 2, 1, 3, 2, 1)  # a crash resent 1 and 2; 1 once more
    again = redeliveries(ledger)
    assert (again.events, again.copies) == (2, 3)
    assert check_delivery(rows, ledger) == []  # at least once: duplicates are allowed


def test_a_row_missing_from_kafka_is_a_violation_whatever_the_source_recorded() -> None:
    rows = outbox_rows("a", "b", "c")
    found = check_delivery(rows, delivered(rows, 1, 3))
    assert [(v.invariant, v.subject) for v in found] == [
        ("not_in_ledger", event_id(TOPIC, "conf-2"))]


def test_a_dead_lettered_row_need_not_be_on_kafka() -> None:
    rows = outbox_rows("a", "b", "c")
    assert check_delivery(rows, delivered(rows, 1, 3), dead_lettered=[2]) == []


def test_a_key_whose_first_deliveries_are_out_of_id_order_is_a_violation() -> None:
    rows = outbox_rows("a", "b", "a")
    found = check_delivery(rows, delivered(rows, 3, 2, 1))
    assert [(v.invariant, v.subject) for v in found] == [("order", f"{TOPIC}/a")]


def test_a_redelivery_after_a_later_event_of_its_key_keeps_the_order() -> None:
    """Per key, the first occurrence of each event counts: 1, 3, then 1 again (a crash
    resent it) is in order."""
    rows = outbox_rows("a", "b", "a")
    assert check_delivery(rows, delivered(rows, 1, 2, 3, 1)) == []


def test_the_duplicate_bound_grows_with_incidents_and_the_logical_window() -> None:
    assert redelivery_bound("table", 50, 0) == redelivery_bound("logical", 50, 0) == 0
    assert redelivery_bound("table", 50, 1) == 200  # two waves of up to 2 x batch_size
    assert redelivery_bound("logical", 50, 1) == 500  # ABOVE_SLOT_BATCHES x batch_size
    assert redelivery_bound("logical", 50, 3) == 3 * redelivery_bound("logical", 50, 1)
    # a transaction's events are passed together: the largest one widens the window
    assert redelivery_bound("logical", 50, 2, largest_txn=300) == 2 * (500 + 300)
    assert redelivery_bound("table", 50, 2, largest_txn=300) == 400


def test_an_insert_the_slot_has_not_passed_is_a_violation() -> None:
    assert slot_unread([]) == []
    assert [(v.invariant, v.subject) for v in slot_unread([7, 9])] == [
        ("slot_unread", "7"), ("slot_unread", "9")]


def test_a_duplicate_no_crash_window_held_is_reported() -> None:
    """An event sent again must have been in a crash's window (on Kafka, not recorded
    delivered); one the relay had recorded going again is reported."""
    rows = outbox_rows("a", "b", "c")
    ledger = delivered(rows, 1, 2, 3, 2, 3)
    two, three = event_id(TOPIC, "conf-2"), event_id(TOPIC, "conf-3")
    assert outside_windows(ledger, [{two}, {three}]) == []
    assert outside_windows(ledger, [{two}]) == [three]
    assert outside_windows(ledger, []) == sorted([two, three])
