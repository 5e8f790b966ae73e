"""Runbook tools behind ``safetynet status``, ``requeue``, ``dead-letters`` and ``replay``.

All are plain synchronous functions over one connection: an operator's command, not
part of the daemon. ``status`` reads the same cheap aggregates the gauges use and judges
each seed SLO; ``requeue`` re-enqueues finalize rows and releases poison conferences
all-or-nothing; ``dead_letters`` lists the outbox's dead letters, ``replay`` puts some
back on the relay's path (all-or-nothing) and ``purge_dead_letters_batch`` deletes old
ones with their rows, as the relay's retention does. The mutating ones are called through
:mod:`supervision.app.actions`, which writes the operator trail in the same transaction.
"""

from __future__ import annotations

import uuid
from typing import Any

import attrs
import psycopg
from psycopg.rows import dict_row

from actors.finalize.queries import FINALIZE_QUERIES
from actors.finalize.store import stats as finalize_stats
from actors.outbox.queries import OUTBOX_QUERIES
from actors.reaper.queries import REAPER_QUERIES
from supervision.app.pauses import paused_jobs
from supervision.app.queries import ALL_QUERIES
from supervision.app.settings import Config
from supervision.app.trail import IdKind, canonical_id, parse_ids
from supervision.errors import SafetynetError


@attrs.frozen
class Verdict:
    slo: str
    ok: bool
    value: float
    detail: str


@attrs.frozen
class Status:
    finalize: dict[str, Any]
    quarantined: list[dict[str, Any]]
    conferences: dict[str, Any]
    poisoned: list[dict[str, Any]]  # poison conferences held out of the reaper's claim
    outbox: dict[str, Any]
    verdicts: list[Verdict]
    paused: list[dict[str, Any]] = attrs.field(factory=list)  # `safetynet pause`

    @property
    def violated(self) -> bool:
        return not all(v.ok for v in self.verdicts)

    def as_json(self) -> dict[str, Any]:
        data = attrs.asdict(self)
        data["violated"] = self.violated
        return data


def status(conn: psycopg.Connection, cfg: Config, outbox_query: str = "outbox_stats"
           ) -> Status:
    """What `safetynet status` prints; *outbox_query* names the outbox figures' statement
    (the console's is capped, console_outbox_stats)."""
    rf, cr = cfg.jobs.recording_finalize, cfg.jobs.conference_reaper
    if cfg.outbox_relay.source == "logical":  # published_at is never set: the slot's view
        outbox_query = "outbox_stats_logical"
    current = finalize_stats(conn)
    with conn.cursor(row_factory=dict_row) as cur:
        slo = cur.execute(FINALIZE_QUERIES["slo_recordings"], {
            "sla": rf.finalize_sla_timeout, "interval": rf.polling_interval}).fetchone()
        quarantined = cur.execute(FINALIZE_QUERIES["finalize_attempts_quarantined_list"],
                                  {"limit": 20}).fetchall()
        outbox = cur.execute(ALL_QUERIES[outbox_query]).fetchone()
        windows = {"empty_room_grace": cr.empty_room_grace,
                   "provision_timeout": cr.provision_timeout,
                   "stale_live_timeout": cr.stale_live_timeout}
        backlog = cur.execute(REAPER_QUERIES["conference_sessions_active_backlog"], windows
                              ).fetchone()
        overdue = cur.execute(REAPER_QUERIES["conference_sessions_active_backlog"], {
            k: v + cr.polling_interval for k, v in windows.items()}).fetchone()
        poisoned = cur.execute(REAPER_QUERIES["conference_poison_list"], {"limit": 20}).fetchall()
    assert slo is not None and outbox is not None and backlog is not None
    assert overdue is not None
    overdue_n = int(next(iter(overdue.values())))
    verdicts = [
        Verdict("recording-finalize: no recording stuck past SLA + interval",
                slo["stuck"] == 0, slo["stuck"], "recordings Recording/Uploading too long"),
        Verdict("recording-finalize: Available-unpublished republished within one interval",
                slo["republish_overdue"] == 0, slo["republish_overdue"],
                "Available recordings waiting for their event"),
        Verdict("conference-reaper: rooms closed within window + interval", overdue_n == 0,
                overdue_n, "active conferences past empty-room/provision/stale window"),
    ]
    return Status(
        finalize={"backlog": current.backlog, "due": current.due,
                  "quarantined": current.quarantined,
                  "oldest_age_seconds": round(current.oldest_age_seconds, 1)},
        quarantined=[{k: str(v) if v is not None else None for k, v in row.items()}
                     for row in quarantined],
        conferences={"active_backlog": int(next(iter(backlog.values()))),
                     "poisoned": int(poisoned[0]["total"]) if poisoned else 0},
        poisoned=[{k: str(v) if v is not None else None for k, v in row.items()
                   if k != "total"} for row in poisoned],
        outbox={"unpublished": int(outbox["unpublished"]),
                "oldest_age_seconds": round(float(outbox["oldest_age_seconds"]), 1),
                "blocked_keys": int(outbox["blocked_keys"]),
                "dead_lettered": int(outbox["dead_lettered"])},
        verdicts=verdicts,
        paused=paused_jobs(conn),
    )


class UnknownIds(SafetynetError):
    """Some ids match neither a finalize row nor a poison conference; nothing changed."""

    def __init__(self, ids: list[str]) -> None:
        self.ids = ids
        super().__init__(", ".join(ids))


@attrs.frozen
class Requeued:
    attempt_id: str
    recording_id: str
    previous_status: str
    previous_attempts: int
    last_error: str | None


@attrs.frozen
class Released:
    """A poison conference forgotten by ``requeue``: the next reaper cycle claims it."""

    conference_id: str
    phase: str
    failures: int
    reason: str


def requeue(conn: psycopg.Connection, ids: list[str], all_quarantined: bool,
            all_poisoned: bool = False) -> list[Requeued | Released]:
    """Pending, attempts 0, due now — for every finalize row named (by its id or its
    recording's id), or every quarantined row; and release every poison conference named
    (or all of them), so the next reaper cycle claims it. Unknown ids change nothing and
    raise UnknownIds."""
    valid = [i for i in ids if _is_uuid(i)]
    with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        if all_quarantined:
            rows = cur.execute(FINALIZE_QUERIES["finalize_attempts_quarantined_ids"]).fetchall()
        else:
            rows = cur.execute(FINALIZE_QUERIES["finalize_attempts_lookup"],
                               {"ids": valid}).fetchall()
        poison = cur.execute(REAPER_QUERIES["conference_poison_lookup"], {
            "ids": valid, "all": all_poisoned}).fetchall()
        known = ({str(r["id"]) for r in rows} | {str(r["recording_id"]) for r in rows}
                 | {str(p["conference_id"]) for p in poison})
        unknown = [i for i in ids if i not in valid or str(uuid.UUID(i)) not in known]
        if unknown:
            raise UnknownIds(unknown)
        cur.execute(FINALIZE_QUERIES["finalize_attempts_requeue"], {"ids": [r["id"] for r in rows]})
        # a person acted: the rows' automatic redrives start again from 0
        cur.execute(FINALIZE_QUERIES["finalize_redrives_forget"], {"ids": [r["id"] for r in rows]})
        cur.execute(REAPER_QUERIES["conference_poison_release"], {
            "ids": [p["conference_id"] for p in poison]})
    return [*(Requeued(str(r["id"]), str(r["recording_id"]), r["status"], r["attempts"],
                       r["last_error"]) for r in rows),
            *(Released(str(p["conference_id"]), p["phase"], p["failures"], p["reason"])
              for p in poison)]


def _is_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True


@attrs.frozen
class DeadLetters:
    """The newest dead letters (``safetynet dead-letters``) and how many there are."""

    total: int
    newest: list[dict[str, Any]]

    def as_json(self) -> dict[str, Any]:
        return attrs.asdict(self)


def dead_letters(conn: psycopg.Connection, limit: int) -> DeadLetters:
    """The *limit* newest dead letters, each with whether it still blocks its key."""
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(OUTBOX_QUERIES["outbox_dead_letters_list"], {"limit": limit}).fetchall()
        total = rows[0]["total"] if rows else 0
    return DeadLetters(int(total), [
        {k: (str(v) if k == "created_at" else v) for k, v in row.items() if k != "total"}
        for row in rows])


@attrs.frozen
class Replayed:
    outbox_id: int
    reason: str  # why it was dead-lettered
    row_gone: bool  # the outbox row was deleted meanwhile: only the dead letter went


def replay(conn: psycopg.Connection, ids: list[str]) -> list[Replayed]:
    """Put the dead-lettered outbox rows *ids* back on the relay's path (their dead
    letters deleted, the row's 'dead-letter:' mark cleared) and wake the relays;
    all-or-nothing: an id that is not a dead letter raises UnknownIds."""
    numbers = sorted(int(i) for i in parse_ids(IdKind.BIGINT, ids).valid)
    with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(OUTBOX_QUERIES["outbox_dead_letters_lookup"],
                           {"ids": numbers}).fetchall()
        known = {str(r["outbox_id"]) for r in rows}
        unknown = [i for i in ids if canonical_id(IdKind.BIGINT, i) not in known]
        if unknown:
            raise UnknownIds(unknown)
        cur.execute(OUTBOX_QUERIES["outbox_dead_letters_replay"], {"ids": numbers})
        cur.execute(OUTBOX_QUERIES["outbox_wake_relays"])  # delivered at commit
    return [Replayed(int(r["outbox_id"]), r["reason"], bool(r["row_gone"])) for r in rows]


def purge_dead_letters_batch(conn: psycopg.Connection, older_than: float, limit: int
                             ) -> list[int]:
    """Delete at most *limit* dead letters older than *older_than* seconds with their
    outbox rows, in the caller's transaction (those still blocking later rows of their key
    stay); the outbox ids purged. ``safetynet dead-letters --purge`` runs it a batch per
    transaction (:func:`supervision.app.actions.purge_dead_letters`), as the relay's
    retention does."""
    return [int(r[0]) for r in conn.execute(OUTBOX_QUERIES["outbox_dead_letters_purge"], {
        "retention": older_than, "limit": limit}).fetchall()]
