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


class Scan(StrEnum):
    """A lease held like a job's that runs no cycle: its holder runs work as long as it leads."""

    DATABASE_SCANS = "database-scans"


SCAN_LEASE = Scan.DATABASE_SCANS
"""The lease of the database-wide reads (gauges, auditor): held like a job's, runs no cycle."""

LeaseName = Job | Scan
"""What a lease is named by: a job, or the scans."""
