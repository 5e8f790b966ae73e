"""The contract as data (supervision/db/schema_contract.py): index equivalence by definition,
and the privileges derived from it for the runtime role (supervision/db/grants.py)."""

from __future__ import annotations

from supervision.db.grants import COLUMN_PRIVILEGES, TABLE_ONLY_PRIVILEGES
from supervision.db.schema_contract import (
    INDEXES,
    CatalogIndex,
    normalized_predicate,
    serves,
)


def test_predicates_match_whatever_casts_and_in_form_postgres_prints() -> None:
    """`status IN (...)` on varchar and on text columns, and = ANY(ARRAY), are one predicate."""
    varchar = ("((status)::text = ANY ((ARRAY['Available'::character varying, "
               "'Failed'::character varying])::text[]))")
    text = "(status = ANY (ARRAY['Available'::text, 'Failed'::text]))"
    written = "status IN ('Available', 'Failed')"
    assert normalized_predicate(varchar) == normalized_predicate(text) \
        == normalized_predicate(written)
    assert normalized_predicate(written) != normalized_predicate("status IN ('Available')")


def index(**overrides: object) -> CatalogIndex:
    base: dict[str, object] = {
        "name": "IX_whatever", "table": "call_recordings",
        "columns": ("session_kind", "session_id"), "unique": False, "valid": True,
        "method": "btree", "predicate": None}
    return CatalogIndex(**{**base, **overrides})  # type: ignore[arg-type]


def test_an_index_serves_by_definition_not_by_name() -> None:
    """Same table, key columns in order, method and predicate serve under any name; a
    unique index serves a plain one, never the other way round."""
    (wanted,) = [i for i in INDEXES if i.name == "ix_recording_session"]
    assert serves(index(), wanted)
    assert serves(index(unique=True), wanted)
    assert not serves(index(columns=("session_id", "session_kind")), wanted)
    assert not serves(index(method="hash"), wanted)
    assert not serves(index(predicate="(status = 'Recording'::text)"), wanted)
    (unique,) = [i for i in INDEXES if i.name == "ux_outbox_dedupe"]
    assert not serves(index(table="integration_outbox", columns=("topic", "dedupe_key")),
                      unique)


def test_runtime_privileges_are_only_what_the_jobs_use() -> None:
    """SELECT on the seven tables; UPDATE where a job writes; INSERT on the two outboxes
    only; DELETE on integration_outbox only (retention), the one privilege with no
    per-column form."""
    order = ("SELECT", "INSERT", "UPDATE", "DELETE")
    granted = {table: tuple(p for p in order if p in {*privileges,
                                                      *TABLE_ONLY_PRIVILEGES.get(table, ())})
               for table, privileges in COLUMN_PRIVILEGES.items()}
    assert granted == {
        "recording_finalize_attempts": ("SELECT", "UPDATE"),
        "call_recordings": ("SELECT", "UPDATE"),
        "call_sessions": ("SELECT",),
        "conference_sessions": ("SELECT", "UPDATE"),
        "conference_participants": ("SELECT",),
        "integration_outbox": ("SELECT", "INSERT", "UPDATE", "DELETE"),
        "realtime_outbox": ("SELECT", "INSERT"),
    }
