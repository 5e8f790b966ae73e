"""The audit as the console runs it (issue #38 item 4): a POST, token-bound, at most one at
a time and one per :data:`AUDIT_MIN_INTERVAL_S`; its last result is kept, with when it ran,
for the audit page (a GET never runs it: a cross-site ``<img>`` cannot make it run)."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from typing import Any

import attrs

AUDIT_MIN_INTERVAL_S = 10.0


@attrs.frozen
class AuditRun:
    at: dt.datetime
    by: str
    violations: list[Any]
    took_s: float

    def age(self, now: dt.datetime | None = None) -> str:
        """How long ago it ran, in words."""
        now = now or dt.datetime.now(dt.UTC)
        seconds = max(0, int((now - self.at).total_seconds()))
        if seconds < 120:
            return f"{seconds} s ago"
        if seconds < 7200:
            return f"{seconds // 60} min ago"
        return f"{seconds // 3600} h ago"


@attrs.define
class Audits:
    """The last audit this console judged; at most one at a time, one per interval."""

    last: AuditRun | None = None
    running: bool = False
    started: float = -AUDIT_MIN_INTERVAL_S
    clock: Callable[[], float] = time.monotonic

    def wait(self) -> float:
        """Seconds until an audit may start (0: now)."""
        if self.running:
            return AUDIT_MIN_INTERVAL_S
        return max(0.0, self.started + AUDIT_MIN_INTERVAL_S - self.clock())

    def start(self) -> float:
        self.running, self.started = True, self.clock()
        return self.started

    def done(self, by: str, violations: list[Any] | None, started: float) -> None:
        """The run ended (*violations* None: it failed, nothing to show)."""
        self.running = False
        if violations is not None:
            self.last = AuditRun(dt.datetime.now(dt.UTC), by, violations,
                                 self.clock() - started)
