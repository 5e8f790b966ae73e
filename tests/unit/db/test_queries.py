"""Named SQL: the runtime's and each job's, loaded from their own packages, never clash."""

from __future__ import annotations

from pathlib import Path

import pytest

from actors.audit.queries import AUDIT_QUERIES
from actors.finalize.queries import FINALIZE_QUERIES
from actors.outbox.queries import OUTBOX_QUERIES
from actors.reaper.queries import REAPER_QUERIES
from supervision.db.queries import QUERIES, load_queries

ROOT = Path(__file__).resolve().parents[3]
ALL = {"runtime": QUERIES, "finalize": FINALIZE_QUERIES, "outbox": OUTBOX_QUERIES,
       "reaper": REAPER_QUERIES, "audit": AUDIT_QUERIES}


def test_no_query_name_is_defined_by_two_owners() -> None:
    """A name belongs to one package: the runtime and the jobs never define the same one."""
    seen: dict[str, str] = {}
    clashes = []
    for owner, queries in ALL.items():
        for name in queries:
            if name in seen:
                clashes.append(f"{name}: {seen[name]} and {owner}")
            seen[name] = owner
    assert clashes == []


def test_every_sql_file_of_a_job_package_is_loaded_by_that_job() -> None:
    """Each job's ``sql/*.sql`` is its own: every name in those files is in the job's dict."""
    for job in ("finalize", "outbox", "reaper", "audit"):
        files = sorted((ROOT / "actors" / job / "sql").glob("*.sql"))
        assert files, job
        names = {line.split()[2] for f in files for line in f.read_text().splitlines()
                 if line.startswith("-- name: ")}
        assert names == set(ALL[job]), job


def test_a_name_defined_twice_in_one_package_is_refused(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Two files of one package naming the same query fail the load, naming the query."""
    pkg = tmp_path / "twice_pkg"
    (pkg / "sql").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sql" / "a.sql").write_text("-- name: thing_get --\nSELECT 1;\n")
    (pkg / "sql" / "b.sql").write_text("-- name: thing_get --\nSELECT 2;\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        load_queries("twice_pkg")
    except RuntimeError as exc:
        assert "thing_get" in str(exc)
    else:
        raise AssertionError("a duplicate name was accepted")


def _package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, sql: str) -> str:
    pkg = tmp_path / name
    (pkg / "sql").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sql" / "a.sql").write_text(sql)
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def test_a_fragment_is_spliced_where_queries_name_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A condition written once (a fragment, which may use an earlier fragment) reads the
    same in every query that names it."""
    name = _package(tmp_path, monkeypatch, "frag_ok", (
        "-- fragment: live --\nc.status = 'Active'\n\n"
        "-- fragment: due --\n@{live} AND c.at < %(as_of)s\n\n"
        "-- name: thing_claim --\nSELECT id FROM t c WHERE @{due} FOR UPDATE;\n\n"
        "-- name: thing_count --\nSELECT count(*) FROM t c WHERE @{due};\n"))
    queries = load_queries(name)
    assert queries == {
        "thing_claim": "SELECT id FROM t c WHERE c.status = 'Active' AND c.at < %(as_of)s "
                       "FOR UPDATE;",
        "thing_count": "SELECT count(*) FROM t c WHERE c.status = 'Active' AND "
                       "c.at < %(as_of)s;"}


def test_an_unknown_a_later_or_an_unused_fragment_fails_the_load(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cases = {
        "frag_unknown": ("-- name: thing_get --\nSELECT @{nowhere};\n", "nowhere"),
        "frag_later": ("-- fragment: a --\n@{b}\n\n-- fragment: b --\n1\n\n"
                       "-- name: thing_get --\nSELECT @{a};\n", "'b'"),
        "frag_unused": ("-- fragment: spare --\n1\n\n-- name: thing_get --\nSELECT 1;\n",
                        "spare"),
    }
    for name, (sql, named) in cases.items():
        _package(tmp_path, monkeypatch, name, sql)
        try:
            load_queries(name)
        except RuntimeError as exc:
            assert named in str(exc), (name, exc)
        else:
            raise AssertionError(f"{name}: loaded")


def test_the_reapers_claims_share_their_phase_conditions() -> None:
    """Each phase's due-condition is written once and read by both halves of its claim
    (the candidates and the locking read), the backed-off poison test by all three."""
    text = (ROOT / "actors" / "reaper" / "sql" / "conference_sessions.sql").read_text()
    text = text[:text.index("-- name: conference_sessions_reap --")]
    assert text.count("safetynet.conference_poison p") == 1
    for phase in ("empty_room", "provision_timeout", "stale_live"):
        claim = REAPER_QUERIES[f"conference_sessions_claim_{phase}"]
        assert claim.count("safetynet.conference_poison p") == 2, phase
        assert text.count(f"@{{conference_due_{phase}}}") == 2, phase
