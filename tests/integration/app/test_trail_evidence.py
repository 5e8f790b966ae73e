"""The operator trail is evidence (issue 36, item 5; migration 0015): the database sets a
row's id, at and db_user whatever the INSERT says, refuses ids that are not of the type
their verb acts on and oversized fields, and the verbs keep within those bounds (what is
not an id is counted, never stored) — as the runtime role `migrate --grant-to` makes, not
only as the tables' owner."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import psycopg
import pytest
from psycopg import sql
from psycopg.types.json import Jsonb

import supervision.db.migrate_plan
from supervision.app import actions
from supervision.app.trail import MAX_IDS, Actor, Origin, Verb, record_action
from supervision.db.migrate import apply_messenger_fixture, grant, migrate
from supervision.dev.postgres import PostgresServer
from tests.cli import cli, postgres_only_config
from tests.integration.app.console.support import console_config, dead_letter, quarantine
from tests.integration.app.console.test_console_asgi import client_for, post, token
from tests.messenger import attempt, new_id

FORGED = ("INSERT INTO safetynet.operator_actions (id, at, db_user, actor, origin, verb)"
          " VALUES (1, '2020-01-01', 'postgres', 'mallory', 'cli', 'pause')"
          " RETURNING id, at, db_user, now(), session_user")
HONEST = ("INSERT INTO safetynet.operator_actions (actor, origin, verb)"
          " VALUES ('mallory', 'cli', 'pause') RETURNING id, at, db_user, now(), session_user")
ANA = Actor("ana", Origin.CLI, "host")


@pytest.fixture
def runtime_dsn(pg_server: PostgresServer, db_dsn: str) -> Iterator[str]:
    """A login role granted by `migrate --grant-to` only (not the tables' owner); its DSN."""
    role, password = f"sn_rt_{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
            sql.Identifier(role), sql.Literal(password)))
    grant(db_dsn, role)
    info = psycopg.conninfo.conninfo_to_dict(db_dsn)
    info.update(user=role, password=password)
    yield psycopg.conninfo.make_conninfo("", **info)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
    with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def rows(dsn: str) -> list[tuple[object, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute("SELECT id, verb, ids, result, pg_column_size(t.*)"
                            " FROM safetynet.operator_actions t ORDER BY id").fetchall()


def test_id_at_and_db_user_are_the_databases_whatever_the_insert_says(
        runtime_dsn: str, db_dsn: str) -> None:
    """The runtime role may not even name id, at or db_user (column privileges: it inserts
    the verbs' columns only); the owner's INSERT naming id 1, at 2020-01-01 and db_user
    postgres stores the next id, the transaction's now() and the session's role (the
    trigger), and so does the runtime role's honest INSERT."""
    with psycopg.connect(runtime_dsn) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute(FORGED)
    stored = []
    for dsn, statement in ((db_dsn, FORGED), (runtime_dsn, HONEST), (db_dsn, FORGED)):
        with psycopg.connect(dsn) as conn:
            row = conn.execute(statement).fetchone()
            assert row is not None
            stored.append(row)
    assert [r[0] for r in stored] == [1, 2, 3]  # the sequence's, not the INSERT's
    for _, at, db_user, now, session in stored:
        assert at == now and db_user == session
    assert stored[0][2] == "postgres" and stored[1][2].startswith("sn_rt_")


def test_the_runtime_role_can_neither_draw_nor_reset_trail_ids(runtime_dsn: str) -> None:
    for statement in ("SELECT nextval('safetynet.operator_actions_id_seq')",
                      "SELECT setval('safetynet.operator_actions_id_seq', 1)"):
        with psycopg.connect(runtime_dsn, autocommit=True) as conn, \
                pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(statement)  # type: ignore[call-overload]


@pytest.mark.parametrize(("verb", "ids", "result"), [
    ("requeue", ["x" * 1_000_000], {}),
    ("requeue", ["ABC"], {}),
    ("release", [str(uuid.uuid4()).upper()], {}),
    ("replay", [str(uuid.uuid4())], {}),
    ("replay", [str(2**63)], {}),
    ("purge-dead-letters", ["007"], {}),
    ("pause", ["Recording Finalize"], {}),
    ("accept-missing", ["s" * 1401], {}),
    ("accept-missing", [None], {}),
    ("requeue", [str(uuid.uuid4()) for _ in range(MAX_IDS + 1)], {}),
    ("audit", [], {"skipped": ["y" * 300_000]}),
], ids=["1MB-id", "not-uuid", "uuid-uppercase", "uuid-for-replay", "over-bigint",
        "leading-zero", "job-name", "long-location", "null-id", "1001-ids", "300KB-result"])
def test_the_database_refuses_ids_of_the_wrong_type_and_oversized_fields(
        runtime_dsn: str, verb: str, ids: list[str | None], result: dict[str, object]
        ) -> None:
    with psycopg.connect(runtime_dsn, autocommit=True) as conn, \
            pytest.raises(psycopg.errors.CheckViolation, match="operator_actions"):
        conn.execute("INSERT INTO safetynet.operator_actions (actor, origin, verb, ids,"
                     " result) VALUES ('m', 'cli', %s, %s, %s)", (verb, ids, Jsonb(result)))
    assert rows(runtime_dsn) == []


def test_well_formed_rows_of_every_kind_are_accepted(runtime_dsn: str) -> None:
    with psycopg.connect(runtime_dsn, autocommit=True) as conn:
        for verb, ids in (("requeue", [new_id()]), ("replay", ["0", str(2**63 - 1)]),
                          ("pause", ["outbox-relay"]), ("accept-missing", ["s3://b/p/"]),
                          ("audit", []), ("requeue", [new_id() for _ in range(MAX_IDS)])):
            conn.execute("INSERT INTO safetynet.operator_actions (actor, origin, verb, ids)"
                         " VALUES ('m', 'cli', %s, %s)", (verb, ids))
    assert len(rows(runtime_dsn)) == 6


def test_the_trail_stays_append_only_for_the_runtime_role(
        runtime_dsn: str) -> None:
    with psycopg.connect(runtime_dsn, autocommit=True) as conn:
        record_action(conn, ANA, Verb.PAUSE, ["outbox-relay"], "x", {})
    for statement in ("UPDATE safetynet.operator_actions SET reason = 'later'",
                      "DELETE FROM safetynet.operator_actions",
                      "TRUNCATE safetynet.operator_actions"):
        with psycopg.connect(runtime_dsn, autocommit=True) as conn, \
                pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(statement)  # type: ignore[call-overload]
    assert [r[2] for r in rows(runtime_dsn)] == [["outbox-relay"]]


def test_a_snapshot_action_counts_what_is_not_an_id_and_stores_no_raw_input(
        runtime_dsn: str, db_dsn: str) -> None:
    """requeue, release and replay snapshots given 50 values of 1 MB each (as a forged
    console form would) beside real ids: the row names only ids of the right type, the
    skipped ones canonical, the rest counted; it stays a few KB."""
    junk = ["z" * 1_000_000] * 50
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        seen, seen_rec = quarantine(conn, "s3:http_503")
        moved, _ = quarantine(conn, "s3:http_503")
        conn.execute("UPDATE messenger.recording_finalize_attempts SET status = 'Done'"
                     " WHERE id = %s", (moved,))
        letter = dead_letter(conn, "kafka:X")
    with psycopg.connect(runtime_dsn, autocommit=True) as conn:
        done = actions.requeue_snapshot(conn, ANA, [*junk, seen, moved.upper()], "r",
                                        status="Quarantined")
        released = actions.release_snapshot(conn, ANA, [*junk, new_id()], "r")
        replayed = actions.replay_snapshot(conn, ANA, [*junk, f"0{letter}", "99999"], "r")
        assert attempt(conn, seen_rec)["status"] == "Pending"
    assert (done.skipped, done.rejected) == ([moved], 50)
    assert (len(released.skipped), released.rejected) == (1, 50)
    assert (replayed.skipped, replayed.rejected) == (["99999"], 50)
    trail = rows(db_dsn)
    assert [(r[1], r[2]) for r in trail] == [
        ("requeue", [seen]), ("release", []), ("replay", [str(letter)])]
    assert trail[0][3]["skipped"] == [moved] and trail[0][3]["rejected"] == 50
    assert trail[2][3]["skipped"] == ["99999"] and trail[2][3]["rejected"] == 50
    assert all(r[4] < 2048 for r in trail)


def test_cli_verbs_given_garbage_count_it_and_store_none_of_it(
        runtime_dsn: str, tmp_path: Path) -> None:
    """`requeue` and `replay` of a 100 KB non-id (and an unknown well-formed id) as the
    runtime role: exit 2, and the refusal's row names the well-formed id only, counting
    the other."""
    config = postgres_only_config(tmp_path, runtime_dsn)
    unknown = new_id()
    assert cli(config, "requeue", "q" * 100_000, unknown, "--reason", "r").returncode == 2
    assert cli(config, "replay", "²", "9" * 30, "123456", "--reason", "r").returncode == 2
    trail = rows(runtime_dsn)
    assert [(r[1], r[2]) for r in trail] == [("requeue", [unknown]), ("replay", ["123456"])]
    assert trail[0][3] == {"refused": "unknown ids", "unknown": [unknown], "ids_rejected": 1}
    assert trail[1][3] == {"refused": "not dead letters", "unknown": ["123456"],
                           "ids_rejected": 2}
    assert all(r[4] < 4096 for r in trail)


def test_more_ids_than_a_row_names_keep_the_first_and_their_count(db_dsn: str) -> None:
    many = [new_id() for _ in range(MAX_IDS + 500)]
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        record_action(conn, ANA, Verb.REQUEUE, many, "bulk", {"rows": many})
    ((_, _, ids, result, _),) = rows(db_dsn)
    assert ids == many[:MAX_IDS] and result["ids_total"] == MAX_IDS + 500
    assert result["rows_total"] == MAX_IDS + 500 and len(result["rows"]) == 100


@pytest.fixture
async def role_console(runtime_dsn: str) -> AsyncIterator[httpx.AsyncClient]:
    async for client in client_for(console_config(runtime_dsn, allow_actions=True)):
        yield client


async def test_a_forged_console_form_of_large_values_leaves_a_small_row(
        db_dsn: str, role_console: httpx.AsyncClient) -> None:
    """The console, connected as the runtime role: a requeue form past the form cap never
    reaches the action (413); one posting values that are not ids beside a row seen
    Quarantined is shown again with the error and changes and records nothing; the row
    alone is requeued, and its trail row is small."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        seen, seen_rec = quarantine(conn, "s3:http_503")
    page = (await role_console.get("/recordings?status=Quarantined")).text
    data = {"token": token(page), "status": "Quarantined", "confirm": "yes",
            "reason": "fixed", "ids": ["w" * 1_000] * 49 + [seen]}
    too_big = await post(role_console, "/actions/requeue", {**data, "ids": ["w" * 200_000]})
    assert too_big.status_code == 413
    refused = await post(role_console, "/actions/requeue", data)
    assert refused.status_code == 400
    assert rows(db_dsn) == []
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        assert attempt(conn, seen_rec)["status"] == "Quarantined"
    done = await post(role_console, "/actions/requeue", {**data, "ids": [seen]})
    assert done.status_code == 200 and "1 changed" in done.text, done.text[:500]
    ((_, verb, ids, result, size),) = rows(db_dsn)
    assert (verb, ids, result["skipped"]) == ("requeue", [seen], [])
    assert size < 4096
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        assert attempt(conn, seen_rec)["status"] == "Pending"


def test_an_upgrade_keeps_the_rows_before_it_and_continues_their_ids(
        empty_db_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A database at 0014 with trail rows (one with a raw id, as earlier releases wrote)
    migrates to 0015 untouched; the next row takes the next id, stamped by the database."""
    shipped = supervision.db.migrate_plan.migrations()
    apply_messenger_fixture(empty_db_dsn)
    monkeypatch.setattr(supervision.db.migrate_plan, "migrations",
                        lambda folder=None: [m for m in shipped if m.version < 15])
    migrate(empty_db_dsn)
    with psycopg.connect(empty_db_dsn, autocommit=True) as conn:
        for ids in (["raw id"], [new_id()]):
            conn.execute("INSERT INTO safetynet.operator_actions (at, actor, origin, verb,"
                         " ids) VALUES ('2020-01-01', 'old', 'cli', 'requeue', %s)", (ids,))
    before = rows(empty_db_dsn)
    monkeypatch.setattr(supervision.db.migrate_plan, "migrations", lambda folder=None: shipped)
    assert [s.migration.version for s in migrate(empty_db_dsn) if s.migration] == [
        m.version for m in shipped if m.version >= 15]
    with psycopg.connect(empty_db_dsn) as conn:
        assert record_action(conn, ANA, Verb.PAUSE, ["outbox-relay"], "after", {}) == 3
        conn.commit()
    after = rows(empty_db_dsn)
    assert after[:2] == before and after[2][1:3] == ("pause", ["outbox-relay"])
