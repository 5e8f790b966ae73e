"""Per-cycle state of the recording-finalize job: counts, the outage breaker, and the
one :class:`FinalizeCycle` its claimer, reconcilers and committers share."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

import attrs
import trio

from actors.finalize.evidence import VerdictGate
from actors.finalize.metrics import S3_BREAKER_OPEN
from actors.finalize.settings import RecordingFinalizeConfig
from actors.s3.objectstore import ObjectStore
from supervision.db.database import Database
from supervision.tree.wakeup import no_wakeup


@attrs.define
class FinalizeCounts:
    """SPEC §7's run-once JSON for recording-finalize (plus two informative extras)."""

    reconciled: int = 0
    republished: int = 0
    failed: int = 0
    quarantined: int = 0
    transient: int = 0
    skipped_locked: int = 0
    duration_ms: int = 0
    rescheduled: int = 0  # session not ended / SLA not passed: not an attempt
    config_fault: int = 0  # rows given back untouched because of a configuration fault
    # (a fault met mid-cycle, or every found object's Content-Type unusable)
    deferred: int = 0  # rows given back untouched because the outage breaker opened
    withheld: int = 0  # Missing verdicts without evidence: given back untouched
    redriven: int = 0  # quarantined rows requeued by the self-healing quarantine

    def as_json(self) -> dict[str, int]:
        return attrs.asdict(self)


@attrs.define
class Breaker:
    """Stops claiming reconcile work when object storage looks down.

    ``threshold`` consecutive transient HEAD outcomes open it for the rest of the cycle;
    so does a configuration fault (``fault`` names it). The next cycle probes the bucket
    before claiming anything that needs a HEAD. ``healthy`` after a cycle: it never
    opened and no HEAD was transient (what the self-healing quarantine waits for).
    """

    threshold: int
    consecutive_transient: int = 0
    open: bool = False
    fault: str | None = None
    transient: int = 0  # transient HEAD outcomes in the whole cycle

    @property
    def healthy(self) -> bool:
        return not self.open and self.fault is None and self.transient == 0

    def record(self, transient: bool) -> None:
        if not transient:
            self.consecutive_transient = 0
            return
        self.transient += 1
        self.consecutive_transient += 1
        if self.consecutive_transient >= self.threshold:
            self.trip()

    def trip(self, fault: str | None = None) -> None:
        self.open = True
        if fault is not None:
            self.fault = fault
        S3_BREAKER_OPEN.set(1)


@attrs.frozen
class FinalizeCycle:
    """One cycle, as its actors see it: built once by ``run_finalize_cycle`` after the
    bucket probe, then handed to the claimer, the reconcilers and the committers (each
    also gets its own channel ends). Frozen: the mutable parts are the counts, the
    breaker and the gate, shared on purpose (one Trio thread, no locks needed)."""

    db: Database  # fenced under the cycle's lease term when it runs under a lock keeper
    cfg: RecordingFinalizeConfig
    store: ObjectStore
    job_run_id: str
    as_of: dt.datetime  # the database clock at the cycle's start: what is due
    deadline: float  # trio.current_time() + max_run_duration: no claim starts after it
    s3_down: bool  # the probe found the bucket unreachable: only rows needing no HEAD
    counts: FinalizeCounts
    breaker: Breaker
    gate: VerdictGate  # Missing verdicts held until there is evidence
    wake_relay: Callable[[], None] = no_wakeup

    @property
    def stop_claiming(self) -> bool:
        """Past the deadline, or the breaker opened: the claimer claims no more."""
        return self.breaker.open or self.past_deadline

    @property
    def past_deadline(self) -> bool:
        return trio.current_time() >= self.deadline
