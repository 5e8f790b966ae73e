"""Shared fixtures: the real server stack (lazily, session-scoped) and fresh databases."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from supervision.devstack import PostgresServer
from supervision.migrate import migrate

pytest_plugins = ["tests.stack_fixtures"]

TEMPLATE_DB = "safetynet_template"


@pytest.fixture(scope="session")
def template_db(pg_server: PostgresServer) -> str:
    """A database migrated once per session; each test copies it (fast, no re-migration)."""
    with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(TEMPLATE_DB)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(TEMPLATE_DB)))
    migrate(pg_server.dsn_for(TEMPLATE_DB))
    return TEMPLATE_DB


@pytest.fixture
def empty_db_dsn(pg_server: PostgresServer) -> Iterator[str]:
    """A fresh database with no schema at all."""
    yield from _fresh_database(pg_server, template=None)


@pytest.fixture
def db_dsn(pg_server: PostgresServer, template_db: str) -> Iterator[str]:
    """A fresh, migrated database of its own for this test (copied from the template)."""
    yield from _fresh_database(pg_server, template=template_db)


def _fresh_database(pg_server: PostgresServer, template: str | None) -> Iterator[str]:
    name = f"t_{uuid.uuid4().hex[:16]}"
    create = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
    if template:
        create += sql.SQL(" TEMPLATE {}").format(sql.Identifier(template))
    with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
        conn.execute(create)
    try:
        yield pg_server.dsn_for(name)
    finally:
        with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
