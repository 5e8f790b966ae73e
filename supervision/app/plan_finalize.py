"""``safetynet plan --job recording-finalize``: the next cycle replayed, read-only.

>>> items = await plan_finalize(cfg, dsn, limit=100)

The cycle's own steps, in its order, with its own parts: the probe and the evidence it
starts with (:func:`~actors.finalize.evidence.gather_evidence`); then the due rows in
claim order, cut into claim batches of ``batch_size`` as the claim would (rows another
transaction holds are skipped by the claim: they take no place in a batch); each batch
announced to a :class:`~actors.finalize.evidence.VerdictGate` and its rows to reconcile
handed to the run's :func:`~actors.finalize.reconciler.run_s3_reconciler` under its
:class:`~actors.finalize.state.Breaker` — one worker, so the HEADs go one at a time in
claim order. The gate judges batch by batch with the evidence of the cycle's start and of
the batches up to the row's own, so the rows shown (the first ``--limit``) need only the
HEADs up to the end of the last shown row's batch; nothing after it can change them.

What the run does and the plan cannot know ahead: which HEADs are in flight when the
breaker opens (the run has a pool of them) and how many claims it had made by then (rows
of claims it did not make stay untouched; the plan shows the later rows' own decisions),
where ``max_run_duration`` stops the claims (rows past it are decided by a later cycle,
whose start evidence may have grown), and rows taken or locked between the plan and the
run. Ties in ``next_attempt_at`` are planned in id order; the claim takes tied rows in
either order.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import trio
from psycopg.rows import dict_row

from actors.envelope import TOPIC_RECORDING_AVAILABLE
from actors.finalize.evidence import Evidence, VerdictGate, gather_evidence
from actors.finalize.holdoff import HoldOff
from actors.finalize.messages import ClaimedRow, ClaimPhase, RowOutcome
from actors.finalize.reconciler import run_s3_reconciler
from actors.finalize.settings import RecordingFinalizeConfig
from actors.finalize.state import Breaker
from actors.s3.objectstore import Fault, Found, Missing, ObjectStore, Transient
from actors.s3.process import open_object_store
from supervision.app.plan_items import (
    PlanItem,
    decided_item,
    finalize_item,
    paused_item,
    skipped_item,
    storage_down_item,
)
from supervision.app.queries import ALL_QUERIES
from supervision.app.settings import Config
from supervision.db.pgconn import connect
from supervision.jobs import Job

BREAKER_THRESHOLD = 5  # FinalizeJob's default: consecutive transient HEADs open it


def query_rows(dsn: str, query: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    """One named query's rows as dicts, on a connection of its own."""
    with connect(dsn, None) as conn, conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(ALL_QUERIES[query], params).fetchall()


class _ReadOnly:
    """What :func:`~actors.finalize.evidence.gather_evidence` needs of a database: its
    reads, one connection each, in a thread."""

    def __init__(self, dsn: str) -> None:
        self._dsn = dsn

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        def call() -> Any:
            with connect(self._dsn, None) as conn:
                return fn(conn, *args)
        return await trio.to_thread.run_sync(call)


async def plan_finalize(cfg: Config, dsn: str, limit: int) -> list[PlanItem]:
    """The next cycle's decision for each of the first *limit* due rows."""
    rf = cfg.jobs.recording_finalize
    # the shown rows, and enough after them to finish the last one's claim batch
    rows = await trio.to_thread.run_sync(query_rows, dsn, "plan_finalize_attempts", {
        "sla": rf.finalize_sla_timeout, "recheck": rf.polling_interval,
        "topic": TOPIC_RECORDING_AVAILABLE, "limit": limit + 2 * rf.batch_size})
    shown = rows[:limit]
    pauses = await trio.to_thread.run_sync(query_rows, dsn, "job_pauses_get",
                                           {"job": str(Job.RECORDING_FINALIZE)})
    if pauses:
        return [paused_item(row, pauses[0]) for row in shown]
    batches = _claim_batches(rows, shown, rf.batch_size)
    async with open_object_store(cfg.s3) as store:
        probe = await store.probe()
        start: Evidence | None = None
        if not isinstance(probe, Fault | Transient):
            found = await gather_evidence(_ReadOnly(dsn), store,  # type: ignore[arg-type]
                                          cfg.s3.bucket, cfg.s3.key_prefix)
            if isinstance(found, Fault | Transient):
                probe = found
            else:
                start = found
        down = probe if isinstance(probe, Fault | Transient) else None
        gate = VerdictGate(evidence=start)
        outcomes = {} if down else await _replay(store, gate, batches)
    hold = HoldOff.of(rf, rows[0]["as_of"]) if rows else None
    return [_item(row, outcomes.get(str(row["id"])), down, gate, rf, cfg.s3.key_prefix, hold)
            for row in shown]


def _claim_batches(rows: list[dict[str, Any]], shown: list[dict[str, Any]],
                   batch_size: int) -> list[list[ClaimedRow]]:
    """The claims the cycle would make, as far as the last shown row's claim: each a list
    of its rows to reconcile (rows held elsewhere are skipped by the claim)."""
    claimable = [row for row in rows if not row["held"]]
    last = max((claimable.index(row) for row in shown if not row["held"]), default=-1)
    count = math.ceil((last + 1) / batch_size)
    return [[_claimed(row, k) for row in claimable[k * batch_size:(k + 1) * batch_size]
             if row["phase"] == ClaimPhase.RECONCILE] for k in range(count)]


def _claimed(row: dict[str, Any], batch: int) -> ClaimedRow:
    """The row as the claim would return it (attempts pre-incremented)."""
    return ClaimedRow(
        attempt_id=str(row["id"]), recording_id=str(row["recording_id"]),
        session_kind=row["session_kind"], session_id=str(row["session_id"]),
        attempts=row["attempts"] + 1, phase=row["phase"],
        recording_status=row["recording_status"], old_attempts=row["attempts"],
        old_next_attempt_at=row["next_attempt_at"], session_ended_at=row["session_ended_at"],
        batch=batch)


async def _replay(store: ObjectStore, gate: VerdictGate,
                  batches: list[list[ClaimedRow]]) -> dict[str, RowOutcome]:
    """Each claimed row's outcome as the run's reconciler and verdict gate give it, the
    HEADs made one at a time in claim order (by attempt id)."""
    breaker = Breaker(BREAKER_THRESHOLD)
    rows_send, rows_recv = trio.open_memory_channel[ClaimedRow](math.inf)
    out_send, out_recv = trio.open_memory_channel[RowOutcome](math.inf)
    decided: list[RowOutcome] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(run_s3_reconciler, store, breaker, gate, rows_recv, out_send)
        async with rows_send:
            for k, batch in enumerate(batches):
                decided += gate.open_batch(k, len(batch))
                for row in batch:
                    await rows_send.send(row)
    async with out_recv:
        decided += [outcome async for outcome in out_recv]
    decided += gate.close(breaker_open=breaker.open)
    return {o.row.attempt_id: o for o in decided}


def _item(row: dict[str, Any], outcome: RowOutcome | None, down: Fault | Transient | None,
          gate: VerdictGate, rf: RecordingFinalizeConfig, key_prefix: str,
          hold: HoldOff | None) -> PlanItem:
    """One shown row's plan item."""
    if row["held"]:
        return skipped_item(row)
    settled = finalize_item(row, rf)
    terminal = row["phase"] == ClaimPhase.TERMINAL
    # a probe fault claims nothing; storage down claims only rows needing no HEAD, and
    # finds them among the recordings already terminal (the claim's two windows)
    if isinstance(down, Fault) or (isinstance(down, Transient) and not terminal):
        return storage_down_item(row, down)
    decision = None if outcome is None else outcome.decision
    if row["recording_held"] and (terminal or isinstance(decision, Found | Missing)):
        return skipped_item(row)  # its commit would skip the recording another holds
    if settled is not None:
        return settled
    assert outcome is not None and hold is not None, row
    evidence = gate.evidence if isinstance(decision, Missing) else None
    return decided_item(row, outcome.decision, evidence, rf, key_prefix,
                        hold.delay(outcome.row))
