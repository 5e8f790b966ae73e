"""Every named query of the house in one read-only view, for the code that knows every job.

The database layer's (:data:`supervision.db.queries.QUERIES`), the app's own
(:data:`APP_QUERIES`, ``supervision/app/sql``: the console's, the plan's, the trail's and the
dev seed's) and each job's (``actors/<job>/sql``) keep separate dictionaries; the app's
operator views (plan, console, runbook) and the tests that EXPLAIN them look names up across
all of them. A name is defined once in the house
(tests/unit/db/test_queries.py), so the order of the chain never decides anything.
"""

from __future__ import annotations

from collections import ChainMap
from collections.abc import Mapping
from typing import LiteralString

from actors.audit.queries import AUDIT_QUERIES
from actors.finalize.queries import FINALIZE_QUERIES
from actors.outbox.queries import OUTBOX_QUERIES
from actors.reaper.queries import REAPER_QUERIES
from supervision.db.queries import QUERIES, load_queries

APP_QUERIES: dict[str, LiteralString] = load_queries("supervision.app")

ALL_QUERIES: Mapping[str, LiteralString] = ChainMap(
    QUERIES, APP_QUERIES, FINALIZE_QUERIES, REAPER_QUERIES, OUTBOX_QUERIES, AUDIT_QUERIES)
