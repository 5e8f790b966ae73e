"""Child and supervisor specifications: the process tree as plain data.

>>> ChildSpec("metrics-exporter", partial(serve_metrics_exporter, listen, readiness),
...           Restart.PERMANENT, shutdown=1.0)

An actor is ``async def serve_x(..., task_status=trio.TASK_STATUS_IGNORED)`` that calls
``task_status.started()`` once it is ready and then runs until cancelled (or returns, or
raises). Its peers are reached only through the memory channels bound into ``start``.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import attrs

from supervision.tree.backoff import Backoff


class Restart(enum.Enum):
    """When a child that exited is started again (OTP's restart types)."""

    PERMANENT = "permanent"  # always
    TRANSIENT = "transient"  # only after it failed (raised)
    TEMPORARY = "temporary"  # never


class Strategy(enum.Enum):
    """Which children restart when one of them is restarted (OTP's strategies)."""

    ONE_FOR_ONE = "one_for_one"  # only that child
    ONE_FOR_ALL = "one_for_all"  # every child
    REST_FOR_ONE = "rest_for_one"  # that child and the ones started after it


Starter = Callable[..., Awaitable[Any]]


@attrs.frozen
class ChildSpec:
    """One child: how to start it, when to restart it, how long it gets to stop."""

    name: str
    start: Starter  # called as start(task_status=...) and must call task_status.started()
    restart: Restart = Restart.PERMANENT
    shutdown: float = 5.0  # seconds between the soft stop and the hard stop


@attrs.frozen
class Intensity:
    """At most ``max_restarts`` restarts of one child within ``window`` seconds."""

    max_restarts: int = 5
    window: float = 60.0
    # the n-th restart in the window waits a time drawn from [0, min(cap, base * 2^(n-1))]
    backoff_base: float = 0.1
    backoff_cap: float = 5.0

    @property
    def backoff(self) -> Backoff:
        """The restart back-off: full jitter over the capped exponential window."""
        return Backoff(base=self.backoff_base, cap=self.backoff_cap)

    def ceiling(self, recent_restarts: int) -> float:
        """The longest wait before a restart, given the restarts in the window."""
        return 0.0 if recent_restarts <= 0 else self.backoff.ceiling(recent_restarts - 1)

    def delay(self, recent_restarts: int) -> float:
        """Back-off before a restart, given how many restarts happened in the window."""
        return 0.0 if recent_restarts <= 0 else self.backoff.delay(recent_restarts - 1)


@attrs.frozen
class SupervisorSpec:
    """A supervisor: its strategy, its intensity and its children in start order."""

    name: str
    children: Sequence[ChildSpec]
    strategy: Strategy = Strategy.ONE_FOR_ONE
    intensity: Intensity = attrs.field(factory=Intensity)

    def __attrs_post_init__(self) -> None:
        names = [c.name for c in self.children]
        if len(set(names)) != len(names):
            raise ValueError(f"supervisor {self.name}: duplicate child names {names}")
