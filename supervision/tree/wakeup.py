"""A coalescing wake-up signal: many ``wake()`` calls before the sleeper runs count once.

>>> wakeup = Wakeup()
>>> wakeup.wake()                       # from a committer, right after its commit
>>> await wakeup.wait(timeout_s=1.0)    # the relay: returns at once, or after the fallback
"""

from __future__ import annotations

import trio


class Wakeup:
    def __init__(self) -> None:
        self._event = trio.Event()

    def wake(self) -> None:
        """Wake the sleeper (never blocks; safe to call from any Trio task)."""
        self._event.set()

    def wake_from_thread(self, token: trio.lowlevel.TrioToken) -> None:
        """Wake the sleeper from a worker thread."""
        token.run_sync_soon(self._event.set)

    async def wait(self, limit_s: float) -> bool:
        """Sleep until woken or *limit_s* passed; True when woken. Resets the signal."""
        with trio.move_on_after(limit_s):
            await self._event.wait()
        woken = self._event.is_set()
        self._event = trio.Event()
        return woken


def no_wakeup() -> None:
    """The wake-up of a job that has no relay to wake (tests, run-once)."""
    return None
