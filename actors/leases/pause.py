"""A job pause as the lock keeper reads it and the operator verbs write it: a row of
``safetynet.job_pauses`` (migration 0006).

Kept apart from :mod:`actors.leases.lease` so that ``safetynet pause``, ``resume`` and
``status`` (plain synchronous verbs over one connection) do not load Trio, structlog
and the pool only to name it.
"""

from __future__ import annotations

import datetime as dt

import attrs


@attrs.frozen
class JobPause:
    """A row of ``safetynet.job_pauses``: the job is paused on every replica."""

    reason: str | None
    paused_at: dt.datetime  # the database clock
    paused_by: str
