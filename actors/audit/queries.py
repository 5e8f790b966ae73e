"""The invariant auditor's named SQL, loaded once from ``actors/audit/sql/*.sql``."""

from __future__ import annotations

from typing import LiteralString

from supervision.db.queries import load_queries

AUDIT_QUERIES: dict[str, LiteralString] = load_queries("actors.audit")
