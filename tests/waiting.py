"""Waiting for an outside server's state (a row count, a process exit) in tests.

Trio tasks coordinate with events; but a database or a broker changes on its own, so
tests poll it — in a worker thread, bounded, with a message that says what never came.
"""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(predicate: Callable[[], bool], limit_s: float, what: str,
               step_s: float = 0.1) -> None:
    """Return once *predicate()* is true; fail the test after *limit_s* seconds.

    Every poll costs CPU on both sides (a query and its connection, a scrape the daemon
    renders, a daemon log read again from its start), and the suite is CPU-bound on two
    cores: 0.1 s is well inside every limit. A test that measures how long something
    took polls finer (*step_s*)."""
    deadline = time.monotonic() + limit_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {limit_s}s waiting for {what}"
        time.sleep(step_s)
