"""Rules that involve more than one key, run once every setting is valid on its own.

>>> list(cross_checks(cfg))
['jobs.recording_finalize.lock_ttl: must be greater than max_run_duration (3m), got 3m']

Generic: the rules find what they judge by walking the tree
(:func:`supervision.tree_walk.sections`), not by naming the root's fields, so a job's
section brings its rules with it. In this order: each leased job's block
(:class:`~supervision.config.leased.LeasedJob`) checks itself; the PostgreSQL timeouts stay
below the TTL of every lease (:class:`~supervision.config.leased.Leased`); then each
section that has rules across its own keys (a ``problems(key)`` method, :class:`Checked`:
the PostgreSQL lock timeout, the Kafka security settings and TLS files, the S3 key pair, a
media token never in clear, a job's back-off or window) gives them, in declaration order.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol, runtime_checkable

from supervision.config.leased import Leased, LeasedJob
from supervision.config.sections import PostgresConfig
from supervision.durations import format_duration
from supervision.tree_walk import sections


@runtime_checkable
class Checked(Protocol):
    """A section with rules across its own keys."""

    def problems(self, key: str) -> Iterator[str]:
        """One line per problem, each naming a key under *key* (the section's dotted key)."""
        ...


def leased_jobs(cfg: Any) -> Iterator[tuple[str, LeasedJob]]:
    """(dotted key, section) of every job run in cycles under a lease, in declaration
    order."""
    return ((key, s) for key, s in sections(cfg) if isinstance(s, LeasedJob))


def cross_checks(cfg: Any) -> Iterator[str]:
    """Rules that involve more than one key, one line per problem."""
    found = list(sections(cfg))
    for key, job in found:
        if isinstance(job, LeasedJob):
            yield from job.lease_problems(key)
    ttls = {f"{key}.lock_ttl": s.lock_ttl for key, s in found if isinstance(s, Leased)}
    for pg_key, pg in found:
        if isinstance(pg, PostgresConfig):
            for name in ("statement_timeout", "idle_in_transaction_session_timeout"):
                value = getattr(pg, name)
                for ttl_key, ttl in ttls.items():
                    if value >= ttl:
                        yield (f"{pg_key}.{name}: must be below {ttl_key} "
                               f"({format_duration(ttl)}), got {format_duration(value)}")
    for key, section in found:
        if isinstance(section, Checked):
            yield from section.problems(key)
