"""Operator actions with their trail row: what the CLI verbs and the console both call.

>>> done = requeue_snapshot(conn, Actor("ana", Origin.CONSOLE, "10.0.0.7"),
...                         ["9d7c…"], "bucket policy fixed", status="Quarantined")
>>> done.changed, done.skipped                # skipped: no longer in the state seen
([Requeued(...)], [])

Each function runs the runbook function (:mod:`supervision.app.runbook`,
:mod:`supervision.app.pauses`) and :func:`~supervision.app.trail.record_action` in one
transaction: the change and its trace commit together. The snapshot variants are the
console's bulk actions: they act on the exact ids the operator saw, re-checked under
``FOR UPDATE`` to be in the state the page showed; an id that moved on since is skipped
and named in the result, never acted on — and nothing "matching" that arrived after the
page was rendered is touched.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import attrs
import psycopg
from psycopg.rows import dict_row

from actors.lock_keeper import JobPause
from supervision.app import runbook
from supervision.app.pauses import Paused, pause_job, resume_job
from supervision.app.trail import Actor, Verb, record_action
from supervision.queries import QUERIES


@attrs.frozen
class Done:
    verb: Verb
    changed: list[runbook.Requeued | runbook.Released]
    skipped: list[str]  # snapshot ids no longer in the state the operator saw
    trail_id: int


def _describe(changed: Sequence[runbook.Requeued | runbook.Released]) -> list[dict[str, Any]]:
    return [attrs.asdict(row) | {"kind": type(row).__name__.lower()} for row in changed]


def requeue(conn: psycopg.Connection, who: Actor, ids: Sequence[str], reason: str | None,
            *, all_quarantined: bool = False, all_poisoned: bool = False,
            verb: Verb = Verb.REQUEUE) -> Done:
    """``safetynet requeue`` / ``safetynet release``: :func:`runbook.requeue` and its trail
    row in one transaction. Unknown ids change nothing, are recorded as refused, and raise
    :class:`runbook.UnknownIds`."""
    try:
        with conn.transaction():
            changed = runbook.requeue(conn, list(ids), all_quarantined, all_poisoned)
            named = list(ids) or [_id(row) for row in changed]
            trail_id = record_action(conn, who, verb, named, reason, {
                "changed": len(changed), "rows": _describe(changed),
                "all_quarantined": all_quarantined, "all_poisoned": all_poisoned})
    except runbook.UnknownIds as exc:
        with conn.transaction():
            record_action(conn, who, verb, list(ids), reason,
                          {"refused": "unknown ids", "unknown": exc.ids})
        raise
    return Done(verb, changed, [], trail_id)


def requeue_snapshot(conn: psycopg.Connection, who: Actor, attempt_ids: Sequence[str],
                     reason: str, *, status: str) -> Done:
    """Requeue the finalize rows *attempt_ids* that are still in *status* (the state the
    operator saw); the others are skipped."""
    ids = _uuids(attempt_ids)
    with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(QUERIES["finalize_attempts_lookup"], {"ids": ids}).fetchall()
        still = sorted(str(r["id"]) for r in rows
                       if str(r["id"]) in ids and r["status"] == status)
        skipped = [i for i in attempt_ids if _norm(i) not in still]
        changed = runbook.requeue(conn, still, False) if still else []
        trail_id = record_action(conn, who, Verb.REQUEUE, still, reason, {
            "changed": len(changed), "rows": _describe(changed), "seen_as": status,
            "skipped": skipped})
    return Done(Verb.REQUEUE, changed, skipped, trail_id)


def release_snapshot(conn: psycopg.Connection, who: Actor, conference_ids: Sequence[str],
                     reason: str) -> Done:
    """Release the poison conferences *conference_ids* still remembered as poison."""
    ids = _uuids(conference_ids)
    with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(QUERIES["conference_poison_lookup"],
                           {"ids": ids, "all": False}).fetchall()
        still = sorted(str(r["conference_id"]) for r in rows)
        skipped = [i for i in conference_ids if _norm(i) not in still]
        changed = runbook.requeue(conn, still, False) if still else []
        trail_id = record_action(conn, who, Verb.RELEASE, still, reason, {
            "changed": len(changed), "rows": _describe(changed), "skipped": skipped})
    return Done(Verb.RELEASE, changed, skipped, trail_id)


def pause(conn: psycopg.Connection, who: Actor, job: str, reason: str | None,
          for_seconds: float | None = None) -> tuple[Paused, int]:
    """``safetynet pause``: the pause and its trail row in one transaction."""
    with conn.transaction():
        done = pause_job(conn, job, reason, _by(who), for_seconds)
        trail_id = record_action(conn, who, Verb.PAUSE, [job], reason, {
            "new": done.new, "paused_by": done.pause.paused_by,
            "paused_at": done.pause.paused_at.isoformat(), "for_seconds": for_seconds})
    return done, trail_id


def resume(conn: psycopg.Connection, who: Actor, job: str, reason: str | None
           ) -> tuple[JobPause | None, int]:
    """``safetynet resume``: the pause it ended (None: not paused), and the trail row's id."""
    with conn.transaction():
        ended = resume_job(conn, job)
        trail_id = record_action(conn, who, Verb.RESUME, [job], reason, {
            "was_paused": ended is not None,
            **({} if ended is None else {"paused_by": ended.paused_by,
                                         "paused_at": ended.paused_at.isoformat()})})
    return ended, trail_id


def _by(who: Actor) -> str:
    return f"{who.name}@{who.client}" if who.client else who.name


def _id(row: runbook.Requeued | runbook.Released) -> str:
    return row.attempt_id if isinstance(row, runbook.Requeued) else row.conference_id


def _norm(text: str) -> str | None:
    try:
        return str(uuid.UUID(text))
    except ValueError:
        return None


def _uuids(ids: Sequence[str]) -> list[str]:
    return [n for n in map(_norm, ids) if n is not None]
