"""The outbox relay's named SQL, loaded once from ``actors/outbox/sql/*.sql``."""

from __future__ import annotations

from typing import LiteralString

from supervision.db.queries import load_queries

OUTBOX_QUERIES: dict[str, LiteralString] = load_queries("actors.outbox")
