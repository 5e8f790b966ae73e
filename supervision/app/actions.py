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
page was rendered is touched (*note*, when given, joins the trail row's result: an
incident's name, filter and page, :mod:`supervision.app.incidents`). The ids given are
parsed as the kind they name (a uuid, an outbox id): what is not one is counted
(``Done.rejected``, ``rejected`` in the trail's result), never acted on nor stored.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Generic, TypeVar

import attrs
import psycopg
from psycopg.rows import dict_row

from actors.finalize.queries import FINALIZE_QUERIES
from actors.leases.pause import JobPause
from actors.outbox.queries import OUTBOX_QUERIES
from actors.reaper.queries import REAPER_QUERIES
from supervision.app import acceptances, runbook
from supervision.app.pauses import Paused, pause_job, resume_job
from supervision.app.trail import Actor, IdKind, Verb, parse_ids, record_action

Row = TypeVar("Row", runbook.Requeued | runbook.Released, runbook.Replayed)


@attrs.frozen
class Done(Generic[Row]):
    verb: Verb
    changed: list[Row]
    skipped: list[str]  # snapshot ids no longer in the state the operator saw
    trail_id: int
    rejected: int = 0  # inputs that were not ids of the kind acted on (counted only)


def _describe(changed: Sequence[runbook.Requeued | runbook.Released | runbook.Replayed]
              ) -> list[dict[str, Any]]:
    return [attrs.asdict(row) | {"kind": type(row).__name__.lower()} for row in changed]


def requeue(conn: psycopg.Connection, who: Actor, ids: Sequence[str], reason: str | None,
            *, all_quarantined: bool = False, all_poisoned: bool = False,
            verb: Verb = Verb.REQUEUE) -> Done[runbook.Requeued | runbook.Released]:
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
            record_action(conn, who, verb, list(ids), reason, {
                "refused": "unknown ids", "unknown": parse_ids(IdKind.UUID, exc.ids).valid})
        raise
    return Done(verb, changed, [], trail_id)


def requeue_snapshot(conn: psycopg.Connection, who: Actor, attempt_ids: Sequence[str],
                     reason: str, *, status: str, note: Mapping[str, Any] | None = None
                     ) -> Done[runbook.Requeued | runbook.Released]:
    """Requeue the finalize rows *attempt_ids* that are still in *status* (the state the
    operator saw); the others are skipped."""
    given = parse_ids(IdKind.UUID, attempt_ids)
    ids = given.valid
    with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(FINALIZE_QUERIES["finalize_attempts_lookup"], {"ids": ids}).fetchall()
        still = sorted(str(r["id"]) for r in rows
                       if str(r["id"]) in ids and r["status"] == status)
        skipped = [i for i in ids if i not in still]
        changed = runbook.requeue(conn, still, False) if still else []
        trail_id = record_action(conn, who, Verb.REQUEUE, still, reason, {
            "changed": len(changed), "rows": _describe(changed), "seen_as": status,
            "skipped": skipped, **given.counts(), **(note or {})})
    return Done(Verb.REQUEUE, changed, skipped, trail_id, given.rejected)


def release_snapshot(conn: psycopg.Connection, who: Actor, conference_ids: Sequence[str],
                     reason: str, *, note: Mapping[str, Any] | None = None
                     ) -> Done[runbook.Requeued | runbook.Released]:
    """Release the poison conferences *conference_ids* still remembered as poison."""
    given = parse_ids(IdKind.UUID, conference_ids)
    ids = given.valid
    with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(REAPER_QUERIES["conference_poison_lookup"],
                           {"ids": ids, "all": False}).fetchall()
        still = sorted(str(r["conference_id"]) for r in rows)
        skipped = [i for i in ids if i not in still]
        changed = runbook.requeue(conn, still, False) if still else []
        trail_id = record_action(conn, who, Verb.RELEASE, still, reason, {
            "changed": len(changed), "rows": _describe(changed), "skipped": skipped,
            **given.counts(), **(note or {})})
    return Done(Verb.RELEASE, changed, skipped, trail_id, given.rejected)


def replay(conn: psycopg.Connection, who: Actor, ids: Sequence[str], reason: str | None
           ) -> Done[runbook.Replayed]:
    """``safetynet replay``: :func:`runbook.replay` of the dead letters *ids* (outbox ids)
    and its trail row in one transaction. An id that is not a dead letter changes nothing,
    is recorded as refused, and raises :class:`runbook.UnknownIds`."""
    try:
        with conn.transaction():
            changed = runbook.replay(conn, list(ids))
            trail_id = record_action(conn, who, Verb.REPLAY, list(ids), reason, {
                "changed": len(changed), "rows": _describe(changed)})
    except runbook.UnknownIds as exc:
        with conn.transaction():
            record_action(conn, who, Verb.REPLAY, list(ids), reason, {
                "refused": "not dead letters",
                "unknown": parse_ids(IdKind.BIGINT, exc.ids).valid})
        raise
    return Done(Verb.REPLAY, changed, [], trail_id)


def replay_snapshot(conn: psycopg.Connection, who: Actor, outbox_ids: Sequence[str],
                    reason: str, *, note: Mapping[str, Any] | None = None
                    ) -> Done[runbook.Replayed]:
    """Replay the dead letters *outbox_ids* the page showed that are still dead letters
    (locked ``FOR UPDATE``); the others (replayed or purged meanwhile) are skipped. A
    replayed dead letter no longer blocks its key: the later rows of the key follow it."""
    given = parse_ids(IdKind.BIGINT, outbox_ids)
    numbers = sorted(int(i) for i in given.valid)
    with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(OUTBOX_QUERIES["outbox_dead_letters_lookup"],
                           {"ids": numbers}).fetchall()
        still = [str(r["outbox_id"]) for r in rows]
        skipped = [i for i in given.valid if i not in still]
        changed = runbook.replay(conn, still) if still else []
        trail_id = record_action(conn, who, Verb.REPLAY, still, reason, {
            "changed": len(changed), "rows": _describe(changed), "skipped": skipped,
            **given.counts(), **(note or {})})
    return Done(Verb.REPLAY, changed, skipped, trail_id, given.rejected)


@attrs.frozen
class Purged:
    purged: int
    trail_ids: list[int]  # one trail row per batch transaction


def purge_dead_letters(conn: psycopg.Connection, who: Actor, older_than: float,
                       reason: str | None, batch: int = 1000) -> Purged:
    """``safetynet dead-letters --purge``: the dead letters older than *older_than* seconds
    go with their outbox rows (not those still blocking later rows of their key), a batch
    per transaction; each batch's transaction writes its own trail row naming the ids it
    purged (the last batch's row, possibly of none, closes the run with the total)."""
    purged, trail_ids = 0, list[int]()
    while True:
        with conn.transaction():
            ids = runbook.purge_dead_letters_batch(conn, older_than, batch)
            purged += len(ids)
            last = len(ids) < batch
            result = {"purged": len(ids), "older_than_seconds": older_than,
                      "batch": len(trail_ids) + 1, "last": last}
            trail_ids.append(record_action(
                conn, who, Verb.PURGE_DEAD_LETTERS, [str(i) for i in ids], reason,
                result | ({"total": purged} if last else {})))
        if last:
            return Purged(purged, trail_ids)


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


def accept_missing(conn: psycopg.Connection, who: Actor, bucket: str, key_prefix: str,
                   seconds: float, reason: str) -> tuple[acceptances.Accepted, int]:
    """``safetynet accept-missing``: the acceptance and its trail row in one transaction
    (the ids are the location it covers)."""
    with conn.transaction():
        done = acceptances.accept_missing(conn, bucket, key_prefix, seconds, reason,
                                          _by(who))
        trail_id = record_action(conn, who, Verb.ACCEPT_MISSING,
                                 [f"s3://{bucket}/{key_prefix}"], reason, {
                                     "accepted_until": done.accepted_until.isoformat(),
                                     "seconds": seconds})
    return done, trail_id


def revoke_acceptance(conn: psycopg.Connection, who: Actor, bucket: str, key_prefix: str,
                      reason: str | None) -> tuple[acceptances.Accepted | None, int]:
    """``safetynet accept-missing --revoke``: the acceptance it ended (None when none was
    in force) and its trail row, in one transaction."""
    with conn.transaction():
        ended = acceptances.revoke_missing(conn, bucket, key_prefix)
        trail_id = record_action(conn, who, Verb.REVOKE_ACCEPTANCE,
                                 [f"s3://{bucket}/{key_prefix}"], reason,
                                 {"ended": ended is not None})
    return ended, trail_id


@attrs.frozen
class SetAside:
    verb: Verb
    changed: list[int]  # the outbox ids set aside
    skipped: list[str]  # snapshot ids no longer in retry (published, dead-lettered, gone)
    trail_id: int
    rejected: int = 0  # inputs that were not outbox ids (counted only)


def set_aside_snapshot(conn: psycopg.Connection, who: Actor, outbox_ids: Sequence[str],
                       reason: str) -> SetAside:
    """Release the keys held back by the rows in retry *outbox_ids* (the frozen-keys page's
    blockers): each still unpublished and failing is dead-lettered without blocking its
    key (:func:`supervision.app.frozen_keys.set_aside`, locked); the others are skipped.
    Trailed as ``release-key``."""
    from supervision.app.frozen_keys import set_aside

    given = parse_ids(IdKind.BIGINT, outbox_ids)
    numbers = sorted(int(i) for i in given.valid)
    with conn.transaction():
        done = set_aside(conn, numbers)
        skipped = [i for i in given.valid if int(i) not in done]
        trail_id = record_action(conn, who, Verb.RELEASE_KEY, [str(n) for n in done],
                                 reason, {"changed": len(done), "set_aside": done,
                                          "skipped": skipped, **given.counts()})
    return SetAside(Verb.RELEASE_KEY, done, skipped, trail_id, given.rejected)


def _by(who: Actor) -> str:
    return f"{who.name}@{who.client}" if who.client else who.name


def _id(row: runbook.Requeued | runbook.Released) -> str:
    return row.attempt_id if isinstance(row, runbook.Requeued) else row.conference_id
