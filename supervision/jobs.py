"""The jobs safetynet runs, by their contract names (leases, pauses, metrics labels, CLI).

    >>> Job("recording-finalize") is Job.RECORDING_FINALIZE
    True
    >>> f"{Job.OUTBOX_RELAY}"
    'outbox-relay'

A ``StrEnum``: a member is the string itself where SQL, labels and logs want the name, and
a typo is an ``AttributeError`` at import instead of a lease nobody ever takes.
"""

from __future__ import annotations

from enum import StrEnum


class Job(StrEnum):
    """A job that runs under a lease, one cycle per tick."""

    RECORDING_FINALIZE = "recording-finalize"
    CONFERENCE_REAPER = "conference-reaper"
    OUTBOX_RELAY = "outbox-relay"


SCAN_LEASE = "database-scans"
"""The lease of the database-wide reads (gauges, auditor): held like a job's, runs no cycle."""
