"""Every named query of the house in one read-only view, for the code that knows every job.

The runtime's (:data:`supervision.queries.QUERIES`) and each job's own (``actors/<job>/sql``)
keep separate dictionaries; the app's operator views (plan, console, runbook) and the tests
that EXPLAIN them look names up across all of them. A name is defined once in the house
(tests/unit/test_queries.py), so the order of the chain never decides anything.
"""

from __future__ import annotations

from collections import ChainMap
from collections.abc import Mapping
from typing import LiteralString

from actors.audit.queries import AUDIT_QUERIES
from actors.finalize.queries import FINALIZE_QUERIES
from actors.outbox.queries import OUTBOX_QUERIES
from actors.reaper.queries import REAPER_QUERIES
from supervision.queries import QUERIES

ALL_QUERIES: Mapping[str, LiteralString] = ChainMap(
    QUERIES, FINALIZE_QUERIES, REAPER_QUERIES, OUTBOX_QUERIES, AUDIT_QUERIES)
