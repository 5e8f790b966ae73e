"""What each console page shows: plain functions over one connection, run in a worker thread.

Every list is a keyset page (``after``/``before`` cursors through an index, at most
:data:`PAGE` rows) and every count is capped or an estimate (the statements of
``supervision/app/sql/console.sql``, and the same ``status`` the CLI prints), so a page
costs the same on a million rows as on ten (bench/console_pages.py).
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from typing import Any

import attrs
import psycopg
from psycopg.rows import dict_row

from actors.audit.invariants import judge_database
from actors.audit.queries import AUDIT_QUERIES
from actors.finalize.store import stats as finalize_stats
from actors.outbox.logical_setup import LogicalSource
from actors.outbox.queries import OUTBOX_QUERIES
from supervision.app import runbook
from supervision.app.audit import audit_thresholds
from supervision.app.queries import ALL_QUERIES
from supervision.app.settings import Config
from supervision.app.trail import Action, history

PAGE = 50
PREVIEW_CHARS = 64 * 1024  # of an outbox row's payload or headers on its page
WINDOWS = ("due", "later", "all")  # recordings: due now, rescheduled later, every Pending
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
NIL = "00000000-0000-0000-0000-000000000000"


def _rows(conn: psycopg.Connection, name: str, params: dict[str, Any]
          ) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(ALL_QUERIES[name], params).fetchall()


def overview(conn: psycopg.Connection, cfg: Config) -> dict[str, Any]:
    """Per job: lease holder and term, pause, backlog, oldest age, SLO verdicts; the
    replicas seen (lease holders); what the cycles last observed of S3."""
    # the outbox figures capped (console_outbox_stats): outbox_stats, the gauges' exact
    # count of live unpublished rows, reads the whole unpublished backlog
    current = runbook.status(conn, cfg, outbox_query="console_outbox_stats")
    leases = _rows(conn, "console_leases", {})
    return {"status": current, "leases": leases,
            # a holder is host:pid:keeper (one keeper per job): the replica is host:pid
            "replicas": sorted({str(lease["holder"]).rsplit(":", 1)[0]
                                for lease in leases if lease["holder"]}),
            "health": _rows(conn, "dependency_health_list", {})}


@attrs.frozen
class Cursor:
    """A keyset position in (next_attempt_at, id) order."""

    at: dt.datetime = EPOCH
    id: str = NIL

    def encode(self) -> str:
        return f"{self.at.isoformat()}_{self.id}"

    @classmethod
    def decode(cls, text: str | None) -> Cursor:
        """The cursor a page's link carries (none: the first page); ValueError when it is
        not one."""
        if not text:
            return cls()
        at, sep, ident = text.rpartition("_")
        if not sep:
            raise ValueError("not a cursor")
        return cls(dt.datetime.fromisoformat(at), str(uuid.UUID(ident)))


def recordings(conn: psycopg.Connection, status: str, window: str, after: Cursor,
               search: str) -> dict[str, Any]:
    """One page of finalize rows in *status* (Pending: due / rescheduled / all), or those of
    one searched id (row, recording, session or file id)."""
    stats = finalize_stats(conn)
    if search:
        try:
            as_uuid: str | None = str(uuid.UUID(search))
        except ValueError:
            as_uuid = None
        rows = _rows(conn, "console_finalize_search",
                     {"uuid": as_uuid, "text": search, "limit": PAGE})
        return {"stats": stats, "rows": rows, "next": None}
    rows = _rows(conn, "console_finalize_page", {
        "status": status, "window": window, "after_at": after.at, "after_id": after.id,
        "limit": PAGE + 1})
    more = len(rows) > PAGE
    rows = rows[:PAGE]
    last = rows[-1] if rows else None
    return {"stats": stats, "rows": rows, "next": Cursor(
        last["next_attempt_at"], str(last["id"])).encode() if more and last else None}


def conferences(conn: psycopg.Connection, cfg: Config) -> dict[str, Any]:
    """The active backlog per phase (capped), and the poison conferences with reasons."""
    cr = cfg.jobs.conference_reaper
    phases = _rows(conn, "console_conference_phase_counts", {
        "empty_room_grace": cr.empty_room_grace, "provision_timeout": cr.provision_timeout,
        "stale_live_timeout": cr.stale_live_timeout})
    poison = _rows(conn, "conference_poison_list", {"limit": PAGE})
    return {"phases": phases, "poison": poison,
            "poison_total": int(poison[0]["total"]) if poison else 0}


def outbox(conn: psycopg.Connection, after: int, before: int | None,
           source: LogicalSource | None = None) -> dict[str, Any]:
    """Unpublished rows (a page in id order), dead letters (a page, newest first); in the
    logical source, the slot (the WAL it retains, its state)."""
    stats = _rows(conn, "console_outbox_stats" if source is None else
                  "outbox_stats_logical", {})[0]
    slot = None if source is None else slot_figures(conn, source)
    rows = _rows(conn, "console_outbox_unpublished_page" if source is None else
                 "console_outbox_unpublished_page_logical", {"after": after, "limit": PAGE + 1})
    dead = _rows(conn, "console_dead_letters_page", {
        "before": before if before is not None else 2**63 - 1, "limit": PAGE + 1})
    return {"stats": stats, "slot": slot, "rows": rows[:PAGE],
            "next": rows[PAGE - 1]["id"] if len(rows) > PAGE else None,
            "dead": dead[:PAGE],
            "dead_next": dead[PAGE - 1]["outbox_id"] if len(dead) > PAGE else None}


def slot_figures(conn: psycopg.Connection, source: LogicalSource) -> dict[str, Any]:
    """The logical source's slot: its name, the WAL it retains (bytes), its wal_status
    (``missing`` when it does not exist)."""
    row = conn.execute(OUTBOX_QUERIES["outbox_slot_describe"], {"slot": source.slot}
                       ).fetchone()
    if row is None:
        return {"name": source.slot, "status": "missing", "retained_bytes": None}
    return {"name": source.slot, "status": row[3] or "unknown",
            "retained_bytes": None if row[6] is None else int(row[6])}


def outbox_row(conn: psycopg.Connection, row_id: int) -> dict[str, Any] | None:
    """One outbox row with the first :data:`PREVIEW_CHARS` of its payload and headers
    (pretty-printed when whole) and their sizes: never the whole of a huge payload."""
    rows = _rows(conn, "console_outbox_get", {"id": row_id, "preview": PREVIEW_CHARS})
    if not rows:
        return None
    row = rows[0]
    for part in ("payload", "headers"):
        text, size = row[f"{part}_preview"], row[f"{part}_bytes"]
        row[f"{part}_whole"] = text is None or len(text.encode()) >= size
        row[f"{part}_text"] = _pretty(text) if row[f"{part}_whole"] else text
    return row


def _pretty(text: str | None) -> str:
    if text is None:
        return "null"
    return json.dumps(json.loads(text), indent=2, sort_keys=True, ensure_ascii=False)


def audit(conn: psycopg.Connection, cfg: Config) -> list[Any]:
    """The SQL invariants judged now, read-only (``safetynet audit``'s database part)."""
    conn.execute(AUDIT_QUERIES["audit_read_only_transaction"])  # this transaction only: pooled
    return judge_database(conn, audit_thresholds(cfg))


def trail(conn: psycopg.Connection, before: int | None, since: dt.datetime | None
          ) -> dict[str, Any]:
    rows: list[Action] = history(conn, since=since, before=before, limit=PAGE + 1)
    return {"rows": rows[:PAGE], "next": rows[PAGE - 1].id if len(rows) > PAGE else None}
