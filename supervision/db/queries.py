"""Named SQL, loaded once: the runtime's from ``supervision/db/sql/queries/*.sql``, each job's
from its own package (``actors/<job>/sql/*.sql``, through :func:`load_queries`).

Each file holds the queries of one table under ``-- name: <table>_<verb> --`` headers
(procrastinate's convention); code calls them by name and never builds SQL strings:

>>> "schema_migrations_list" in QUERIES
True

A condition several queries share is written once, as a fragment: a ``-- fragment: <name>
--`` block of the same package, spliced where a query says ``@{<name>}`` when the files are
loaded (packaged text into packaged text: the result is as static as a query written out).
An unknown or unused fragment fails the load.
"""

from __future__ import annotations

import re
from importlib import resources
from typing import LiteralString

_HEADER = re.compile(r"^-- (name|fragment): ([a-z0-9_]+) --\s*$", re.MULTILINE)
_SPLICE = re.compile(r"@\{([a-z0-9_]+)\}")


def load_queries(package: str, *folder: str) -> dict[str, LiteralString]:
    """Every named query of the ``.sql`` files in *package*'s folder (default ``sql``),
    with the package's fragments spliced in."""
    queries: dict[str, str] = {}
    fragments: dict[str, str] = {}
    place = resources.files(package).joinpath(*(folder or ("sql",)))
    for entry in sorted(place.iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".sql"):
            continue
        chunks = _HEADER.split(entry.read_text(encoding="utf-8"))
        for kind, name, body in zip(chunks[1::3], chunks[2::3], chunks[3::3], strict=True):
            into = queries if kind == "name" else fragments
            if name in queries or name in fragments:
                raise RuntimeError(f"query {name!r} defined twice ({entry.name})")
            lines = [ln for ln in body.strip().splitlines() if not ln.startswith("--")]
            into[name] = "\n".join(lines).strip()
    return _spliced(queries, fragments, package)


def _spliced(queries: dict[str, str], fragments: dict[str, str],
             package: str) -> dict[str, LiteralString]:
    """Each ``@{name}`` replaced by its fragment; a fragment may use only the fragments
    defined before it (so no cycle can form)."""
    ready: dict[str, str] = {}
    used: set[str] = set()

    def splice(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in ready:
            raise RuntimeError(f"{package}: unknown fragment {name!r} (or used before it "
                               "is defined)")
        used.add(name)
        return ready[name]

    for name, body in fragments.items():
        ready[name] = _SPLICE.sub(splice, body)
    # Packaged files, never user input: safe to hand to the driver as a literal.
    done: dict[str, LiteralString] = {
        name: _SPLICE.sub(splice, body) for name, body in queries.items()}
    if unused := sorted(set(fragments) - used):
        raise RuntimeError(f"{package}: fragment(s) never used: {', '.join(unused)}")
    return done


QUERIES: dict[str, LiteralString] = load_queries("supervision.db", "sql", "queries")
