"""What ``migrate --grant-to`` (the runtime role) and ``--grant-read-to`` (a read-only role)
grant, from one source: :data:`COLUMN_PRIVILEGES`, derived from the columns check-schema
checks (:data:`supervision.db.schema_contract.COLUMNS`). The roles are recorded in
``safetynet.grantees`` and granted again by every ``migrate`` (docs/operations.md, "Grants
that survive upgrades").

On a messenger table a role gets exactly the contract's columns: a table-level REVOKE
first (it takes the columns' privileges with it, and an earlier release's whole-table
grants), then SELECT on every contract column (and the system columns ``plan`` reads) and
UPDATE / INSERT on the written / inserted ones; DELETE on the outbox (retention; no column
form). USAGE on a messenger sequence only for a serial id an INSERT draws from (an
identity needs none). In the safetynet schema: DML on its tables (the ledger read-only,
the operator trail append-only, the grantee list not at all; of the trail's columns only
those the verbs write), EXECUTE on its functions. The read-only role gets SELECT only,
everywhere.
"""

from __future__ import annotations

import hashlib
from typing import Any, Literal

import psycopg
from psycopg import sql

from supervision.db import schema_contract as contract
from supervision.db.queries import QUERIES
from supervision.errors import MigrationError

Access = Literal["runtime", "read"]

# System columns a verb reads (every table has them, check-schema has nothing to check):
# ``plan`` tells a row held by another transaction from its xmax (supervision/app/sql/plan.sql);
# in the relay's logical source the views, retention and the auditor tell a row the slot
# has passed from its xmin (actors/outbox/sql, actors/audit/sql/audit.sql).
SYSTEM_COLUMNS: dict[str, tuple[str, ...]] = {
    "recording_finalize_attempts": ("xmax",), "call_recordings": ("xmax",),
    "integration_outbox": ("xmin",)}


def _column_privileges() -> dict[str, dict[str, tuple[str, ...]]]:
    """table -> privilege -> columns: SELECT on every contract column (a written column is
    read by its UPDATE's expressions and RETURNING too) and on :data:`SYSTEM_COLUMNS`,
    UPDATE on the written ones, INSERT on the inserted ones. ``migrate --grant-to`` grants
    exactly these per column."""
    out: dict[str, dict[str, dict[str, None]]] = {t: {} for t in contract.TABLES}
    for table, names in SYSTEM_COLUMNS.items():
        out[table]["SELECT"] = dict.fromkeys(names)
    kind = {"read": None, "write": "UPDATE", "insert": "INSERT"}
    for column in contract.COLUMNS:
        for privilege in ("SELECT", kind[column.access]):
            if privilege is not None:
                out[column.table].setdefault(privilege, {})[column.name] = None
    return {t: {p: tuple(cols) for p, cols in privs.items()} for t, privs in out.items()}


COLUMN_PRIVILEGES: dict[str, dict[str, tuple[str, ...]]] = _column_privileges()
# table-level privileges that have no per-column form: outbox retention's DELETE
TABLE_ONLY_PRIVILEGES: dict[str, tuple[str, ...]] = {"integration_outbox": ("DELETE",)}
# The outbox tables whose id INSERTs draw: USAGE on its sequence only when it is a
# serial's (an identity column needs no grant).
SEQUENCE_TABLES = ("integration_outbox", "realtime_outbox")

# what the verbs write into the operator trail (supervision/app/sql/operator_actions.sql)
TRAIL_COLUMNS = ("actor", "origin", "client", "verb", "ids", "reason", "result")


def recorded(conn: psycopg.Connection[Any]) -> list[tuple[str, Access, str | None]]:
    """The recorded grantees that still exist: (role, access, digest of the last grants)."""
    exists = conn.execute(QUERIES["schema_migrations_grantees_exist"]).fetchone()
    if exists is None or exists[0] is None:
        return []
    rows = conn.execute(QUERIES["schema_migrations_grantees_list"]).fetchall()
    return [(str(r[0]), "read" if r[1] == "read" else "runtime",
             None if r[2] is None else str(r[2])) for r in rows]


def adopted(conn: psycopg.Connection[Any]) -> list[str]:
    """Before migration 0014 (no grantee list yet): the runtime roles an earlier release's
    ``--grant-to`` granted, recorded and granted again by the upgrade (whose migrate, the
    Kubernetes Job's, names none)."""
    exists = conn.execute(QUERIES["schema_migrations_grantees_exist"]).fetchone()
    if exists is not None and exists[0] is not None:
        return []
    return [str(r[0]) for r in conn.execute(
        QUERIES["schema_migrations_previous_grantees"]).fetchall()]


def require_role(conn: psycopg.Connection[Any], role: str) -> None:
    if conn.execute(QUERIES["schema_migrations_role_exists"], {"role": role}).fetchone() is None:
        raise MigrationError(f"role {role!r} does not exist; create it first "
                             "(docs/operations.md)")


def _columns(names: tuple[str, ...]) -> sql.Composable:
    return sql.SQL(", ").join(sql.Identifier(n) for n in names)


def _messenger(who: sql.Identifier, access: Access) -> list[sql.Composable]:
    out: list[sql.Composable] = []
    for table, privileges in COLUMN_PRIVILEGES.items():
        target = sql.SQL("messenger.{}").format(sql.Identifier(table))
        out.append(sql.SQL("REVOKE ALL ON {} FROM {}").format(target, who))
        for privilege, columns in privileges.items():
            if access == "read" and privilege != "SELECT":
                continue
            out.append(sql.SQL("GRANT {} ({}) ON {} TO {}").format(
                sql.SQL(privilege), _columns(columns), target, who))
        if access == "runtime":
            for privilege in TABLE_ONLY_PRIVILEGES.get(table, ()):
                out.append(sql.SQL("GRANT {} ON {} TO {}").format(
                    sql.SQL(privilege), target, who))
    return out


def _sequences(conn: psycopg.Connection[Any], who: sql.Identifier) -> list[sql.Composable]:
    out: list[sql.Composable] = []
    for table in SEQUENCE_TABLES:
        row = conn.execute(QUERIES["schema_migrations_serial_sequence"],
                           {"table": f"messenger.{table}"}).fetchone()
        if row and row[0]:  # a serial's sequence (an identity column needs no grant)
            out.append(sql.SQL("GRANT USAGE ON SEQUENCE {} TO {}").format(
                sql.SQL(row[0]), who))
    return out


def _safetynet(who: sql.Identifier, access: Access) -> list[sql.Composable]:
    if access == "read":
        return [sql.SQL("REVOKE ALL ON ALL TABLES IN SCHEMA safetynet FROM {}").format(who),
                sql.SQL("GRANT SELECT ON ALL TABLES IN SCHEMA safetynet TO {}").format(who),
                sql.SQL("REVOKE ALL ON safetynet.grantees FROM {}").format(who),
                sql.SQL("GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA safetynet TO {}")
                .format(who)]
    return [
        sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA safetynet "
                "TO {}").format(who),
        sql.SQL("REVOKE INSERT, UPDATE, DELETE ON safetynet.schema_migrations FROM {}")
        .format(who),
        # the operator trail is append-only (its trigger refuses it too): read, and add
        # only the columns the verbs write (id, at and db_user are the database's)
        sql.SQL("REVOKE INSERT, UPDATE, DELETE ON safetynet.operator_actions FROM {}")
        .format(who),
        sql.SQL("GRANT INSERT ({}) ON safetynet.operator_actions TO {}").format(
            _columns(TRAIL_COLUMNS), who),
        sql.SQL("REVOKE ALL ON safetynet.grantees FROM {}").format(who),
        sql.SQL("GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA safetynet TO {}").format(who),
    ]


def grant_statements(conn: psycopg.Connection[Any], role: str,
                     access: Access) -> list[sql.Composable]:
    """The grants of *role*, without its record in safetynet.grantees."""
    who = sql.Identifier(role)
    out: list[sql.Composable] = [
        sql.SQL("GRANT USAGE ON SCHEMA messenger, safetynet TO {}").format(who)]
    out += _messenger(who, access)
    if access == "runtime":
        out += _sequences(conn, who)
    return out + _safetynet(who, access)


def digest(statements: list[sql.Composable]) -> str:
    text = "\n".join(s.as_string(None) for s in statements)
    return hashlib.sha256(text.encode()).hexdigest()


def statements(conn: psycopg.Connection[Any], role: str,
               access: Access) -> list[sql.Composable | tuple[str, dict[str, Any]]]:
    """*role*'s record in safetynet.grantees (with the digest of its grants), then the
    grants: a named query with its parameters, then composed statements."""
    grants = grant_statements(conn, role, access)
    record = (QUERIES["schema_migrations_grantees_record"],
              {"role": role, "access": access, "digest": digest(grants)})
    return [record, *grants]
