"""A wrong configuration must not turn present binaries into Failed verdicts (issues #13,
#25): the positive canary, the must-not-exist canary, evidence before Missing verdicts
and the content-type rule, on real PostgreSQL and SeaweedFS."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import tomli_w
from prometheus_client import REGISTRY
from structlog.testing import capture_logs

from supervision.app.queries import ALL_QUERIES
from supervision.app.settings import Config
from supervision.dev.processes import DevStackError
from supervision.dev.s3 import S3Server
from supervision.tree.health import HEALTH
from tests.cli import cli
from tests.conftest import make_config
from tests.faults import put_recordings
from tests.integration.finalize.test_recording_finalize import counts_of, run_cycle
from tests.messenger import (
    attempt,
    fetch,
    insert_attempt,
    insert_call_session,
    insert_recording,
    skip_backoff,
)

OTHER_BUCKET = "call-recordings-elsewhere"


@pytest.fixture
def conn(db_dsn: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(db_dsn, autocommit=True) as c:
        yield c


@pytest.fixture(autouse=True)
def clean_health() -> Iterator[None]:
    yield
    for component in list(HEALTH.faults):
        HEALTH.clear_fault(component)


@pytest.fixture(scope="module")
def other_bucket(s3_server: S3Server) -> str:
    """A bucket that exists but holds none of the recordings."""
    with contextlib.suppress(DevStackError):  # there already from an earlier run
        s3_server.create_bucket(OTHER_BUCKET)
    return OTHER_BUCKET


def config(db_dsn: str, s3_server: S3Server, bucket: str, **s3: Any) -> Config:
    return make_config(db_dsn, s3_server=s3_server, bucket=bucket, s3=s3)


async def due_recordings_with_binaries(conn: psycopg.Connection, s3_server: S3Server,
                                       bucket: str, count: int) -> list[str]:
    """*count* lost callbacks of long-ended calls, due now, each binary uploaded at
    ``call-recordings/{id}``."""
    rows = conn.execute(ALL_QUERIES["dev_seed_recordings"], {"n": count, "available": 0}
                        ).fetchall()
    ids = [str(r[0]) for r in rows]
    await put_recordings(s3_server, bucket, ids)
    return ids


async def known_present_recording(conn: psycopg.Connection, s3_server: S3Server,
                                  bucket: str) -> str:
    """An Available recording finalised earlier (its row Done), its binary in place."""
    rid = insert_recording(conn, session_id=insert_call_session(conn), status="Available",
                           with_attempt=False).id
    insert_attempt(conn, rid, str(uuid.uuid4()), status="Done")
    await put_recordings(s3_server, bucket, [rid])
    return rid


def statuses(conn: psycopg.Connection, ids: list[str]) -> dict[str, int]:
    rows = fetch(conn, "SELECT status, count(*) AS n FROM messenger.call_recordings"
                       " WHERE id = ANY(%s::uuid[]) GROUP BY status", ids)
    return {r["status"]: r["n"] for r in rows}


def attempts_spent(conn: psycopg.Connection, ids: list[str]) -> int:
    (row,) = fetch(conn, "SELECT COALESCE(sum(attempts), 0) AS n"
                         " FROM messenger.recording_finalize_attempts"
                         " WHERE recording_id = ANY(%s::uuid[])", ids)
    return int(row["n"])


def due_in(conn: psycopg.Connection, ids: list[str]) -> list[float]:
    """Seconds until each row is due again, on the database clock."""
    rows = fetch(conn, "SELECT extract(epoch FROM next_attempt_at - now())::float8 AS s"
                       " FROM messenger.recording_finalize_attempts"
                       " WHERE recording_id = ANY(%s::uuid[])", ids)
    return [float(r["s"]) for r in rows]


@pytest.mark.parametrize("wrong", ["key_prefix", "bucket"])
async def test_wrong_prefix_or_bucket_fails_nothing_and_fixing_it_heals_everything(
        db_dsn: str, conn: psycopg.Connection, s3_server: S3Server, bucket: str,
        other_bucket: str, wrong: str) -> None:
    """1,000 due recordings whose binaries exist, and a daemon pointed at the wrong prefix
    (or at a bucket that exists but is the wrong one): the recording known to be present
    answers 404, so each cycle is a configuration fault — after 5 cycles nothing is Failed
    and no attempt is spent. With the configuration fixed, all 1,000 become Available."""
    ids = await due_recordings_with_binaries(conn, s3_server, bucket, 1000)
    known = await known_present_recording(conn, s3_server, bucket)
    misconfigured = (config(db_dsn, s3_server, bucket, key_prefix="call-recordngs/")
                     if wrong == "key_prefix" else config(db_dsn, s3_server, other_bucket))

    for _ in range(5):
        counts = await run_cycle(misconfigured)
        assert counts_of(counts) == {}
    assert statuses(conn, ids) == {"Uploading": 667, "Recording": 333}
    assert attempts_spent(conn, ids) == 0
    assert HEALTH.reason() == f"configuration fault in s3: known_recording_not_found:{known}"

    healed = await run_cycle(config(db_dsn, s3_server, bucket))
    assert counts_of(healed) == {"reconciled": 1000}
    assert statuses(conn, ids) == {"Available": 1000}
    assert HEALTH.reason() is None


@pytest.mark.parametrize("wrong", ["key_prefix", "bucket"])
async def test_fresh_install_with_wrong_prefix_or_bucket_withholds_every_verdict(
        db_dsn: str, conn: psycopg.Connection, s3_server: S3Server, bucket: str,
        other_bucket: str, wrong: str) -> None:
    """A fresh install (no Available recording anywhere, so no positive canary) pointed at
    the wrong prefix, or at a bucket that exists but is the wrong one, while the binaries
    sit under the right prefix: nothing shows that its 404s mean "not uploaded" (nothing
    listed there, nothing found), so no row is Failed and no attempt spent; every verdict
    is withheld, counted, and readiness names the reason. A withheld row is not HEADed
    again before its hold-off (backoff_base at least): the next 4 cycles do nothing. With
    the configuration fixed, every row becomes Available once due and readiness recovers."""
    ids = await due_recordings_with_binaries(conn, s3_server, bucket, 500)
    misconfigured = (config(db_dsn, s3_server, bucket, key_prefix="call-recordngs/")
                     if wrong == "key_prefix" else config(db_dsn, s3_server, other_bucket))
    before = REGISTRY.get_sample_value(
        "safetynet_recording_finalize_verdicts_withheld_total") or 0.0

    assert counts_of(await run_cycle(misconfigured)) == {"withheld": 500}
    for _ in range(4):
        assert counts_of(await run_cycle(misconfigured)) == {}
    assert statuses(conn, ids) == {"Uploading": 334, "Recording": 166}
    assert attempts_spent(conn, ids) == 0
    assert {attempt(conn, rid)["status"] for rid in ids} == {"Pending"}
    assert min(due_in(conn, ids)) >= misconfigured.jobs.recording_finalize.backoff_base - 5
    assert REGISTRY.get_sample_value(
        "safetynet_recording_finalize_verdicts_withheld_total") == before + 500
    assert HEALTH.reason() == "configuration fault in s3_evidence: no_evidence_for_key_prefix"

    skip_backoff(db_dsn)  # the hold-off has passed
    healed = await run_cycle(config(db_dsn, s3_server, bucket))
    assert counts_of(healed) == {"reconciled": 500}
    assert statuses(conn, ids) == {"Available": 500}
    assert HEALTH.reason() is None


async def test_fresh_prefix_with_genuinely_lost_binaries_fails_once_an_operator_accepts(
        db_dsn: str, conn: psycopg.Connection, s3_server: S3Server, bucket: str,
        tmp_path: Path) -> None:
    """A first deployment whose recorder never uploaded anything: the verdicts are
    withheld until `safetynet accept-missing` (reason given, for a while) accepts them
    for this bucket and prefix; then they are given at once. The acceptance does not
    follow the configuration to another prefix, --revoke ends it, and both are in the
    operator trail."""
    prefix = f"fresh-{uuid.uuid4().hex[:8]}/"
    cfg = config(db_dsn, s3_server, bucket, key_prefix=prefix)
    ids = [insert_recording(conn, session_id=insert_call_session(conn)).id for _ in range(20)]
    assert counts_of(await run_cycle(cfg)) == {"withheld": 20}

    path = tmp_path / "c.toml"
    path.write_text(tomli_w.dumps({"postgres": {"dsn": db_dsn},
                                   "s3": {"bucket": bucket, "key_prefix": prefix}}))
    refused = cli(path, "accept-missing", "--for", "2d", "--reason", "INC-7")
    assert refused.returncode == 2 and "24h" in refused.stderr
    accepted = cli(path, "accept-missing", "--for", "2h", "--reason", "INC-7 recorder down")
    assert accepted.returncode == 0, accepted.stderr
    assert accepted.stdout.startswith(f"Missing verdicts under s3://{bucket}/{prefix}"
                                      " accepted until ")
    other = config(db_dsn, s3_server, bucket, key_prefix=f"other-{prefix}")
    other_row = insert_recording(conn, session_id=insert_call_session(conn)).id
    conn.execute("UPDATE messenger.recording_finalize_attempts SET next_attempt_at ="
                 " now() + interval '1 hour' WHERE recording_id <> %s", (other_row,))
    assert counts_of(await run_cycle(other)) == {"withheld": 1}
    conn.execute("UPDATE messenger.recording_finalize_attempts SET next_attempt_at ="
                 " now() - interval '1 second' WHERE status = 'Pending'")

    with capture_logs() as logs:
        counts = await run_cycle(cfg)
    assert counts_of(counts) == {"failed": 21}
    assert statuses(conn, ids) == {"Failed": 20}
    assert [e["reason"] for e in logs
            if e["event"] == "missing_verdicts_accepted_by_operator"] == ["INC-7 recorder down"]
    assert cli(path, "accept-missing", "--revoke").stdout.startswith(
        f"revoked the acceptance for s3://{bucket}/{prefix} (trail #")
    assert cli(path, "accept-missing", "--revoke").stdout.startswith(
        f"no acceptance in force for s3://{bucket}/{prefix} (trail #")
    trail = conn.execute(
        "SELECT verb, ids, reason, result FROM safetynet.operator_actions"
        " WHERE verb IN ('accept-missing', 'revoke-acceptance') ORDER BY id").fetchall()
    where = [f"s3://{bucket}/{prefix}"]
    assert [(verb, ids, reason) for verb, ids, reason, _ in trail] == [
        ("accept-missing", where, "INC-7 recorder down"),
        ("revoke-acceptance", where, None), ("revoke-acceptance", where, None)]
    assert [result.get("ended") for *_, result in trail[1:]] == [True, False]


async def test_every_object_octet_stream_is_a_configuration_fault_not_50_quarantines(
        db_dsn: str, conn: psycopg.Connection, s3_server: S3Server, bucket: str) -> None:
    """A recorder (or bucket policy) writing application/octet-stream: 50 due recordings
    whose objects all carry it are not 50 poison rows but one configuration fault —
    nothing quarantined, nothing Failed, no attempt spent, readiness 503 naming it. With
    the objects' Content-Type fixed, all 50 become Available."""
    ids = [insert_recording(conn, session_id=insert_call_session(conn)).id for _ in range(50)]
    await put_recordings(s3_server, bucket, ids, content_type="application/octet-stream")

    counts = await run_cycle(config(db_dsn, s3_server, bucket))
    assert counts_of(counts) == {"config_fault": 50}
    assert statuses(conn, ids) == {"Uploading": 50}
    assert {attempt(conn, rid)["status"] for rid in ids} == {"Pending"}
    assert attempts_spent(conn, ids) == 0
    assert min(due_in(conn, ids)) >= 55  # held off like a withheld verdict
    assert HEALTH.reason() == ("configuration fault in s3_content_type:"
                               " content_type_unusable:application/octet-stream")

    await put_recordings(s3_server, bucket, ids)
    skip_backoff(db_dsn)  # the hold-off has passed
    healed = await run_cycle(config(db_dsn, s3_server, bucket))
    assert counts_of(healed) == {"reconciled": 50}
    assert HEALTH.reason() is None


async def test_one_octet_stream_object_among_good_ones_is_quarantined_alone(
        db_dsn: str, conn: psycopg.Connection, s3_server: S3Server, bucket: str) -> None:
    """One odd object next to usable ones stays per-row poison: quarantined with its
    reason while the others are reconciled; no configuration fault."""
    ids = [insert_recording(conn, session_id=insert_call_session(conn)).id for _ in range(6)]
    await put_recordings(s3_server, bucket, ids[1:])
    await put_recordings(s3_server, bucket, ids[:1], content_type="application/octet-stream")
    counts = await run_cycle(config(db_dsn, s3_server, bucket))
    assert counts_of(counts) == {"reconciled": 5, "quarantined": 1}
    assert attempt(conn, ids[0])["last_error"] == (
        "object:content_type_unknown:application/octet-stream")
    assert HEALTH.reason() is None


async def test_must_not_exist_canary_answering_200_is_a_configuration_fault(
        db_dsn: str, conn: psycopg.Connection, s3_server: S3Server, bucket: str) -> None:
    """The probe key under the prefix exists (as behind an endpoint that answers 200 to
    anything): its HEADs cannot tell present from missing, so nothing is claimed."""
    prefix = f"canary-{uuid.uuid4().hex[:8]}/"
    await put_recordings(s3_server, bucket, ["__safetynet_probe__"], prefix=prefix)
    rec = insert_recording(conn, session_id=insert_call_session(conn, ended_ago=3600))
    counts = await run_cycle(config(db_dsn, s3_server, bucket, key_prefix=prefix))
    assert counts_of(counts) == {}
    assert attempt(conn, rec.id)["attempts"] == 0
    assert HEALTH.reason() == "configuration fault in s3: canary_key_exists"
