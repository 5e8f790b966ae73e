"""Named SQL: the runtime's and each job's, loaded from their own packages, never clash."""

from __future__ import annotations

from pathlib import Path

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
