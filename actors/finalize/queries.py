"""The recording-finalize job's named SQL, loaded once from ``actors/finalize/sql/*.sql``."""

from __future__ import annotations

from typing import LiteralString

from supervision.db.queries import load_queries

FINALIZE_QUERIES: dict[str, LiteralString] = load_queries("actors.finalize")
