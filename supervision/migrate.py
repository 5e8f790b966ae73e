"""Versioned schema migrations: ``sql/migrations/NNNN_name.sql`` applied in order, once.

Each migration runs in its own transaction together with its row in
``safetynet.schema_migrations`` (kept outside the ``messenger`` schema, which holds
exactly SPEC §2); a transaction-scoped advisory lock serialises concurrent runs, so two
daemons migrating at once apply each file exactly once. Re-running is a no-op. A file
that changed after it was applied is refused (its checksum no longer matches).
"""

from __future__ import annotations

import hashlib
import re
from importlib import resources
from typing import LiteralString

import attrs
import psycopg

from supervision.errors import MigrationError
from supervision.queries import QUERIES

_FILE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


@attrs.frozen
class Migration:
    version: int
    name: str
    sql: LiteralString  # packaged files, never user input

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


def migrations() -> list[Migration]:
    """Every migration shipped with the package, in version order."""
    folder = resources.files("supervision") / "sql" / "migrations"
    found = []
    for entry in folder.iterdir():
        match = _FILE.match(entry.name)
        if match:
            found.append(
                Migration(int(match[1]), match[2], entry.read_text(encoding="utf-8"))
            )
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise MigrationError(f"duplicate migration versions: {versions}")
    return found


def migrate(dsn: str) -> list[Migration]:
    """Apply the pending migrations to the database at *dsn*; return those applied."""
    applied: list[Migration] = []
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            for migration in migrations():
                with conn.transaction():
                    conn.execute(QUERIES["schema_migrations_lock"])
                    conn.execute(QUERIES["schema_migrations_pin_search_path"])
                    conn.execute(QUERIES["schema_migrations_create"])
                    done = {
                        row[0]: row
                        for row in conn.execute(QUERIES["schema_migrations_list"]).fetchall()
                    }
                    if migration.version in done:
                        if done[migration.version][2] != migration.checksum:
                            raise MigrationError(
                                f"migration {migration.version:04d}_{migration.name} changed "
                                "after it was applied; add a new migration instead"
                            )
                        continue
                    # Packaged files, never user input.
                    conn.execute(migration.sql)
                    conn.execute(
                        QUERIES["schema_migrations_insert"],
                        {"version": migration.version, "name": migration.name,
                         "checksum": migration.checksum},
                    )
                    applied.append(migration)
    except psycopg.Error as exc:
        raise MigrationError(f"migration failed: {type(exc).__name__}: {exc}") from exc
    return applied
