"""The positive canary: before any Missing verdict, HEAD objects that are known to exist.

>>> probe = await check_known_present(db, store)   # Found | None | Transient | Fault

The bucket probe and the must-not-exist canary prove that object storage answers; they
cannot prove that its 404s mean "not uploaded". A wrong ``s3.key_prefix``, a bucket that
exists but is the wrong one, or an endpoint answering 404 to every object would make
every due recording ``Failed/Timeout`` — irreversible verdicts, at scale. So each cycle
HEADs, the way a reconcile would (``{key_prefix}{recording_id}``), up to
:data:`CANDIDATES` recordings already Available (their finalize rows Done, newest first):

* one of them found (metadata good or not) → that :class:`Found`: healthy, and the
  cycle's evidence that a 404 means "not uploaded" (:mod:`actors.finalize.evidence`);
* a fault (403, ``NoSuchBucket``) → that configuration fault;
* every one 404 → :class:`Fault` ``known_recording_not_found:<id>``: a configuration
  fault — nothing is claimed, no attempt is spent, readiness is 503 and the
  ``ConfigurationFault`` alert fires, exactly like a missing bucket;
* otherwise (none found, some transient) → that :class:`Transient`: the breaker is open
  for the cycle, so only rows that need no HEAD are claimed.

With no Available recording yet there is nothing to compare with: ``None`` (healthy, but
no evidence either: the cycle looks for it elsewhere, :mod:`actors.finalize.evidence`).
Several candidates, not one, so that a single binary deleted on purpose (retention, a
manual clean-up) does not stop the job.

What cancellation does: nothing to clean up — a HEAD in flight is abandoned, no row is
touched.
"""

from __future__ import annotations

import structlog

from actors.finalize.store import known_present
from actors.s3.objectstore import Fault, Found, ObjectStore, Poison, Transient
from supervision.db.database import Database

log = structlog.get_logger("finalize_canary")
CANDIDATES = 3


async def check_known_present(db: Database, store: ObjectStore
                              ) -> Found | Transient | Fault | None:
    """HEAD recordings known to exist; a 404 on every one is a configuration fault, no
    candidate at all is None."""
    recording_ids = await db.run(known_present, CANDIDATES)
    transient: Transient | None = None
    for recording_id in recording_ids:
        outcome = await store.head_recording(recording_id)
        if isinstance(outcome, Found):
            return outcome
        if isinstance(outcome, Poison):  # it exists, whatever its metadata
            return Found(recording_id, 0, "", 0)
        if isinstance(outcome, Fault):
            return outcome
        if isinstance(outcome, Transient):
            transient = transient or outcome
    if transient is not None:  # nothing found, not every answer a 404: cannot tell yet
        return transient
    if recording_ids:
        log.error("known_recording_not_found", recording_ids=recording_ids)
        return Fault(f"known_recording_not_found:{recording_ids[0]}")
    return None
