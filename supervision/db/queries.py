"""Named SQL, loaded once: the runtime's from ``supervision/db/sql/queries/*.sql``, each job's
from its own package (``actors/<job>/sql/*.sql``, through :func:`load_queries`).

Each file holds the queries of one table under ``-- name: <table>_<verb> --`` headers
(procrastinate's convention); code calls them by name and never builds SQL strings:

>>> "schema_migrations_list" in QUERIES
True
"""

from __future__ import annotations

import re
from importlib import resources
from typing import LiteralString

_HEADER = re.compile(r"^-- name: ([a-z0-9_]+) --\s*$", re.MULTILINE)


def load_queries(package: str, *folder: str) -> dict[str, LiteralString]:
    """Every named query of the ``.sql`` files in *package*'s folder (default ``sql``)."""
    queries: dict[str, LiteralString] = {}
    place = resources.files(package).joinpath(*(folder or ("sql",)))
    for entry in sorted(place.iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".sql"):
            continue
        chunks = _HEADER.split(entry.read_text(encoding="utf-8"))
        for name, body in zip(chunks[1::2], chunks[2::2], strict=True):
            if name in queries:
                raise RuntimeError(f"query {name!r} defined twice ({entry.name})")
            lines = [ln for ln in body.strip().splitlines() if not ln.startswith("--")]
            # Packaged files, never user input: safe to hand to the driver as a literal.
            queries[name] = "\n".join(lines).strip()
    return queries


QUERIES: dict[str, LiteralString] = load_queries("supervision.db", "sql", "queries")
