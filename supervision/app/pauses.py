"""Runtime control behind ``safetynet pause`` / ``safetynet resume`` (issue #18).

>>> pause_job(conn, Job.RECORDING_FINALIZE, "S3 migration tonight", operator())
Paused(pause=JobPause(...), new=True)

A pause is a row of ``safetynet.job_pauses`` (migration 0006). Every replica's lock
keeper reads it right before it would take the job's lease, so the job stops on every
replica at its next cycle start (a cycle already running finishes) and starts again at
the first tick after ``resume``. Plain synchronous functions over one connection: an
operator's command, not part of the daemon.
"""

from __future__ import annotations

import getpass
import os
import socket
from typing import Any

import attrs
import psycopg
from psycopg.rows import dict_row

from actors.leases.pause import JobPause
from supervision.db.queries import QUERIES


@attrs.frozen
class Paused:
    pause: JobPause  # the pause in force: this one (new) or the one already there
    new: bool


def operator() -> str:
    """Who pauses, as the pause row records it: the OS user and the host."""
    try:
        user = getpass.getuser()
    except (OSError, KeyError):  # no login name (a container without a passwd entry)
        user = f"uid:{os.getuid()}"
    return f"{user}@{socket.gethostname()}"


def pause_job(conn: psycopg.Connection, job: str, reason: str | None, by: str,
              for_seconds: float | None = None) -> Paused:
    """Pause *job* on every replica (for *for_seconds*, or until resumed); a job paused
    already keeps its first pause.

    *by* (the OS user and host, which the operator's environment may set to anything:
    ``$USER``) is recorded with the database role the session authenticated as, which it
    cannot: ``alice@bastion [db:ops_alice]``."""
    role = conn.execute(QUERIES["db_session_user"]).fetchone()
    by = f"{by} [db:{role[0] if role else '?'}]"
    with conn.transaction():
        row = conn.execute(QUERIES["job_pauses_insert"], {
            "job": job, "reason": reason, "paused_by": by,
            "seconds": for_seconds}).fetchone()
        if row is not None:
            return Paused(JobPause(*row), new=True)
        row = conn.execute(QUERIES["job_pauses_get"], {"job": job}).fetchone()
    assert row is not None
    return Paused(JobPause(*row), new=False)


def resume_job(conn: psycopg.Connection, job: str) -> JobPause | None:
    """Resume *job*: the pause it ended, or None when it was not paused."""
    row = conn.execute(QUERIES["job_pauses_delete"], {"job": job}).fetchone()
    return None if row is None else JobPause(*row)


def paused_jobs(conn: psycopg.Connection) -> list[dict[str, Any]]:
    """Every paused job, for ``status``: job, reason, paused_at, paused_by, paused_for."""
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(QUERIES["job_pauses_list"]).fetchall()
    return [{"job": r["job"], "reason": r["reason"], "paused_at": str(r["paused_at"]),
             "paused_by": r["paused_by"], "paused_for_seconds": r["paused_for_seconds"],
             "expires_at": None if r["expires_at"] is None else str(r["expires_at"])}
            for r in rows]
