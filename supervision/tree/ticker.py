"""Fixed-interval scheduling that never overlaps a running cycle.

>>> ticker = Ticker(interval=60.0, first_delay=0.5)
>>> while True:
...     await ticker.wait()      # the first tick comes soon after start
...     await run_cycle()        # a long cycle delays the next tick; missed ticks coalesce

Ticks are due at ``start + first_delay + k * interval``. When a cycle overruns due ticks,
they coalesce into one tick that fires as soon as the cycle ends; the schedule does not
drift and the job never runs several catch-up cycles in a row.
"""

from __future__ import annotations

import math

import trio


class Ticker:
    def __init__(self, interval: float, first_delay: float = 0.0) -> None:
        if interval <= 0:
            raise ValueError("interval must be > 0")
        self.interval = interval
        self._next = trio.current_time() + first_delay
        self.missed = 0  # ticks skipped because a cycle overran them

    def delay(self) -> float:
        """Seconds until the next tick is due (0 when it is overdue)."""
        return max(0.0, self._next - trio.current_time())

    async def wait(self) -> None:
        """Return at the next due tick: at once (one coalesced tick) if it is overdue."""
        now = trio.current_time()
        if self._next > now:
            await trio.sleep_until(self._next)
            fired = self._next
        else:
            overdue = math.floor((now - self._next) / self.interval)
            self.missed += overdue
            fired = self._next + overdue * self.interval
            await trio.lowlevel.checkpoint()
        self._next = fired + self.interval
