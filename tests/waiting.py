"""Waiting for an outside server's state (a row count, a process exit) in tests.

Trio tasks coordinate with events; but a database or a broker changes on its own, so
tests poll it — in a worker thread, bounded, with a message that says what never came.
"""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(predicate: Callable[[], bool], limit_s: float, what: str,
               step_s: float = 0.02) -> None:
    """Return once *predicate()* is true; fail the test after *limit_s* seconds."""
    deadline = time.monotonic() + limit_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {limit_s}s waiting for {what}"
        time.sleep(step_s)
