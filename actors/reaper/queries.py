"""The conference-reaper job's named SQL, loaded once from ``actors/reaper/sql/*.sql``."""

from __future__ import annotations

from typing import LiteralString

from supervision.db.queries import load_queries

REAPER_QUERIES: dict[str, LiteralString] = load_queries("actors.reaper")
