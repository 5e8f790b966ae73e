"""`safetynet requeue|replay|release --incident NAME` with a filter: `--preview` changes
nothing; acting freezes the matching ids and acts on them page by page, each re-checked
under lock (supervision/app/incidents.py), one trail row per page."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest

from supervision.app import incidents
from supervision.app.trail import Actor, Origin, Verb
from tests.cli import cli, postgres_only_config
from tests.integration.app.console.support import dead_letter, quarantine
from tests.messenger import attempt


@pytest.fixture
def conn(db_dsn: str) -> Any:
    with psycopg.connect(db_dsn, autocommit=True) as c:
        yield c


@pytest.fixture
def config(db_dsn: str, tmp_path: Path) -> Path:
    return postgres_only_config(tmp_path, db_dsn)


def trail(conn: psycopg.Connection) -> list[tuple[Any, ...]]:
    return conn.execute("SELECT verb, ids, reason, result FROM safetynet.operator_actions"
                        " ORDER BY id").fetchall()


def test_preview_prints_the_count_and_a_sample_and_changes_nothing(
        config: Path, conn: psycopg.Connection) -> None:
    hit = [quarantine(conn, "s3:http_503") for _ in range(2)]
    miss, _ = quarantine(conn, "ffmpeg: bad header")
    proc = cli(config, "requeue", "--incident", "INC-1", "--error", "HTTP_503",
               "--since", "1h", "--preview")
    assert proc.returncode == 0, proc.stderr
    assert "2 row(s) would change" in proc.stdout
    assert all(a in proc.stdout for a, _ in hit) and miss not in proc.stdout
    assert all(attempt(conn, rec)["status"] == "Quarantined" for _, rec in hit)
    assert trail(conn) == []


def test_acting_by_a_filter_needs_a_reason_and_writes_a_trail_row_per_page(
        config: Path, conn: psycopg.Connection) -> None:
    letters = [dead_letter(conn, "kafka:MESSAGE_TOO_LARGE", key=f"order-{i}")
               for i in range(3)]
    other = dead_letter(conn, "kafka:MESSAGE_TOO_LARGE", key="invoice-1")
    refused = cli(config, "replay", "--incident", "INC-2", "--key-prefix", "order-")
    assert refused.returncode == 2 and "--reason" in refused.stderr
    proc = cli(config, "replay", "--incident", "INC-2", "--key-prefix", "order-",
               "--topic", "t", "--reason", "broker limit raised")
    assert proc.returncode == 0, proc.stderr
    assert "page 1 of 1: 3 changed" in proc.stdout
    ((verb, ids, reason, result),) = trail(conn)
    assert (verb, sorted(int(i) for i in ids), reason) == (
        "replay", letters, "broker limit raised")
    assert result["incident"] == "INC-2" and result["filter"]["key_prefix"] == "order-"
    left = [r[0] for r in conn.execute("SELECT outbox_id FROM"
                                       " safetynet.outbox_dead_letters")]
    assert left == [other]


@pytest.mark.parametrize(("args", "named"), [
    (("requeue", "--incident", "I", "--since", "2 hours", "--preview"), "--since"),
    (("requeue", "--incident", "I", "--status", "Done", "--preview"), "--status"),
    (("requeue", "--incident", "I", "--topic", "t"), "--topic"),
    (("release", "--since", "1h", "--preview"), "--incident"),
    (("replay", "--incident", "I", "--since", "1000000d", "--preview"), "--since"),
    (("replay", "1", "--incident", "I", "--preview"), "--incident"),
])
def test_a_bad_filter_exits_2_naming_the_option(
        config: Path, args: tuple[str, ...], named: str) -> None:
    proc = cli(config, *args)
    assert proc.returncode == 2 and named in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_acting_rechecks_each_previewed_id_and_skips_what_moved_on(
        conn: psycopg.Connection) -> None:
    """The CLI's pages: a row that left Quarantined after the preview is skipped and named;
    one quarantined after it is not touched, though it matches."""
    seen, seen_rec = quarantine(conn, "s3:http_503")
    moved, _ = quarantine(conn, "s3:http_503")
    f = incidents.parse_filter(Verb.REQUEUE, {"status": "Quarantined", "error": "503"})
    preview = incidents.preview(conn, f)
    assert sorted(preview.ids) == sorted([seen, moved])
    conn.execute("UPDATE messenger.recording_finalize_attempts SET status = 'Done'"
                 " WHERE id = %s", (moved,))
    _, later_rec = quarantine(conn, "s3:http_503")
    done = incidents.act_page(conn, Actor("ana", Origin.CLI), f, preview.ids, "INC-3",
                              "fixed", page=1, pages=1, total=preview.count)
    assert [r.attempt_id for r in done.changed] == [seen] and done.skipped == [moved]
    assert attempt(conn, seen_rec)["status"] == "Pending"
    assert attempt(conn, later_rec)["status"] == "Quarantined"


def test_accept_missing_preview_names_what_it_would_replace_and_changes_nothing(
        config: Path, conn: psycopg.Connection) -> None:
    first = cli(config, "accept-missing", "--for", "2h", "--preview")
    assert first.returncode == 0, first.stderr
    assert "would accept Missing verdicts under s3://" in first.stdout
    assert "no acceptance in force now" in first.stdout
    assert conn.execute("SELECT count(*) FROM safetynet.missing_verdict_acceptances"
                        ).fetchone() == (0,)
    assert trail(conn) == []
    accepted = cli(config, "accept-missing", "--for", "1h", "--reason", "INC-4 lost uploads")
    assert accepted.returncode == 0, accepted.stderr
    again = cli(config, "accept-missing", "--for", "2h", "--preview")
    assert "replacing the acceptance in force until" in again.stdout
    assert "INC-4 lost uploads" in again.stdout and len(trail(conn)) == 1
    too_long = cli(config, "accept-missing", "--for", "25h", "--preview")
    assert too_long.returncode == 2 and "--for" in too_long.stderr


def test_a_filter_option_with_ids_is_refused_not_ignored(config: Path) -> None:
    proc = cli(config, "requeue", "--status", "Pending", "9d7c2a56-2f4b-4b8e-9a55-"
               "0d6d1c1f7e3a", "--reason", "r")
    assert proc.returncode == 2 and "--incident" in proc.stderr, proc.stderr


def test_a_preview_past_the_snapshot_cap_says_more_matched(conn: psycopg.Connection) -> None:
    for _ in range(3):
        quarantine(conn, "s3:http_503")
    f = incidents.parse_filter(Verb.REQUEUE, {"status": "Quarantined"})
    seen = incidents.preview(conn, f, limit=2)
    assert (seen.count, seen.capped, seen.window_cut) == (2, True, False)
    assert incidents.preview(conn, f).capped is False
