"""The block every job run under a lease shares, and the lease every sectioned job holds.

>>> @attrs.frozen
... class NightlyConfig(LeasedJob):
...     polling_interval: float = polling_interval_setting(60.0)
...     lock_ttl: float = lock_ttl_setting(300.0)
...     max_run_duration: float = max_run_duration_setting(180.0)

A section whose work runs under a lease of the lock keeper is :class:`Leased` (it has a
``lock_ttl``): the generic checks (:mod:`.checks`) find every one in the tree and keep the
PostgreSQL timeouts below its TTL. A job that runs in cycles under that lease is a
:class:`LeasedJob`: ``polling_interval``, ``lock_ttl`` and ``max_run_duration`` are
declared once, below, with their docs, bounds and the rule that binds them (the lease
outlives the longest cycle); each job gives only its defaults, and its TOML keys stay flat
(``jobs.recording_finalize.lock_ttl``). The jobs' sections themselves live with their job
(``actors/<job>/settings.py``) and the root that gathers them in the composition root
(:mod:`supervision.app.settings`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from supervision.config.fields import HOUR, positive, setting
from supervision.durations import format_duration


def polling_interval_setting(default: float) -> Any:
    """A leased job's ``polling_interval`` setting, with the job's *default*."""
    return setting(default, "Time between cycle starts.", duration=True, checks=[positive],
                   maximum=HOUR)


def lock_ttl_setting(default: float) -> Any:
    """A leased job's ``lock_ttl`` setting, with the job's *default*."""
    return setting(
        default, "TTL of the job's lease and bound of one cycle; must exceed "
        "max_run_duration. The lease is renewed every lock_ttl/4 while a cycle runs: a "
        "frozen leader is replaced this long after its last renewal (plus one "
        "polling_interval).", duration=True, checks=[positive], maximum=2 * HOUR)


def max_run_duration_setting(default: float) -> Any:
    """A leased job's ``max_run_duration`` setting, with the job's *default*."""
    return setting(default, "A cycle stops claiming after this long.", duration=True,
                   checks=[positive], maximum=HOUR)


class Leased:
    """A section whose work runs under a lease of *lock_ttl* seconds (declared by the
    section with its own doc and default). Adds no field of its own."""

    __slots__ = ()

    lock_ttl: float


class LeasedJob(Leased):
    """A job that runs in cycles under a lease (the lock keeper): its section declares
    ``polling_interval = polling_interval_setting(...)``, ``lock_ttl =
    lock_ttl_setting(...)`` and ``max_run_duration = max_run_duration_setting(...)``.
    Adds no field of its own."""

    __slots__ = ()

    polling_interval: float
    lock_ttl: float
    max_run_duration: float

    def lease_problems(self, key: str) -> Iterator[str]:
        """What is wrong with the block as a whole (*key*: the section's dotted key)."""
        if self.lock_ttl <= self.max_run_duration:
            yield (f"{key}.lock_ttl: must be greater than max_run_duration "
                   f"({format_duration(self.max_run_duration)}), got "
                   f"{format_duration(self.lock_ttl)}")
