"""Shared pieces of the console tests: a config with a known login, seeded incidents."""

from __future__ import annotations

import base64
import functools
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from supervision.app.settings import Config
from supervision.dev.ports import free_ports
from supervision.passwords import MIN_N, hash_password
from tests.conftest import make_config
from tests.messenger import insert_call_session, insert_recording

USER, PASSWORD = "oncall", "correct horse battery"
SCRIPT = "<script>document.title='pwned'</script>"


@functools.cache
def password_hash() -> str:
    return hash_password(PASSWORD, n=MIN_N)  # fast: tests log in often


def console_config(dsn: str, **console: Any) -> Config:
    """A console with the test login; its daemon's metrics on a port nobody serves."""
    return make_config(dsn, console={"user": USER, "password_hash": password_hash(),
                                     **console},
                       http={"listen": f"127.0.0.1:{free_ports(1)[0]}"})


def basic(user: str = USER, password: str = PASSWORD) -> dict[str, str]:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


def quarantine(conn: psycopg.Connection, last_error: str) -> tuple[str, str]:
    """A quarantined finalize row: (its id, its recording id)."""
    sid = insert_call_session(conn)
    rec = insert_recording(conn, session_id=sid, attempts=8)
    conn.execute("UPDATE messenger.recording_finalize_attempts SET status = 'Quarantined',"
                 " last_error = %s WHERE id = %s", (last_error, rec.attempt_id))
    assert rec.attempt_id is not None
    return rec.attempt_id, rec.id


def dead_letter(conn: psycopg.Connection, reason: str, *, key: str = "k",
                days_old: int = 0, payload: dict[str, Any] | None = None) -> int:
    """An unpublished outbox row dead-lettered with *reason*, *days_old* days ago; its id."""
    (row_id,) = conn.execute(
        "INSERT INTO messenger.integration_outbox (topic, message_key, dedupe_key,"
        " event_type, payload) VALUES ('t', %s, gen_random_uuid()::text, 'e', %s)"
        " RETURNING id", (key, Jsonb(payload or {}))).fetchone() or (0,)
    conn.execute("INSERT INTO safetynet.outbox_dead_letters (outbox_id, topic, message_key,"
                 " reason, blocks_key, created_at) VALUES (%s, 't', %s, %s, true,"
                 " now() - %s * interval '1 day')", (row_id, key, reason, days_old))
    return int(row_id)
