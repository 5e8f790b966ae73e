"""The console's incident snapshots: the ids a preview froze, kept server-side.

>>> kept = Snapshots()
>>> snap = kept.put("ana", preview_, "INC-42")    # its token goes into the preview's form
>>> kept.get(snap.token, "ana") is snap           # None: unknown, expired, another login's
True

A snapshot is bound to the login that previewed it, lives at most :data:`TTL_S` and at most
:data:`MAX_SNAPSHOTS` are kept (the oldest goes first), each at most
:data:`supervision.app.incidents.SNAPSHOT_MAX` ids: a few MiB at most. It is in this
process's memory only: a restarted console, or another replica behind a balancer, has not
seen it, and says so (preview again). Pages are acted on in order, one at a time, at most
one per :data:`MIN_PAGE_INTERVAL_S` across the console (a large incident is worked through
page by page without hammering the messenger's database).
"""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import attrs

from supervision.app import incidents
from supervision.app.incidents import Preview

MAX_SNAPSHOTS = 8
TTL_S = 3600.0
MIN_PAGE_INTERVAL_S = 1.0
MAX_SKIPPED_KEPT = 1000  # skipped ids a snapshot remembers for its summary


@attrs.define
class Snapshot:
    token: str
    user: str
    preview: Preview
    incident: str
    created: float
    pages: list[list[str]]
    next_page: int = 1  # 1-based: the page the next act POST must name
    reason: str = ""
    changed: int = 0
    skipped: list[str] = attrs.field(factory=list)
    trail_ids: list[int] = attrs.field(factory=list)

    @property
    def finished(self) -> bool:
        return self.next_page > len(self.pages)

    def record(self, page: int, done: Any) -> None:
        """Page *page* acted on (its :class:`~supervision.app.actions.Done`)."""
        self.next_page = page + 1
        self.changed += len(done.changed)
        room = MAX_SKIPPED_KEPT - len(self.skipped)
        self.skipped.extend(done.skipped[:max(0, room)])
        self.trail_ids.append(done.trail_id)


class Snapshots:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._kept: OrderedDict[str, Snapshot] = OrderedDict()
        self._clock = clock
        self._last_page = -MIN_PAGE_INTERVAL_S
        self.busy = False  # a page is being acted on

    def put(self, user: str, preview: Preview, incident: str) -> Snapshot:
        self._sweep()
        while len(self._kept) >= MAX_SNAPSHOTS:
            self._kept.popitem(last=False)
        token = secrets.token_urlsafe(18)
        snap = Snapshot(token, user, preview, incident, self._clock(),
                        preview.pages(incidents.PAGE_SIZE))
        self._kept[token] = snap
        return snap

    def get(self, token: str, user: str) -> Snapshot | None:
        self._sweep()
        snap = self._kept.get(token)
        return snap if snap is not None and secrets.compare_digest(snap.user, user) \
            else None

    def wait(self) -> float:
        """Seconds until the next page may be acted on (0: now)."""
        if self.busy:
            return MIN_PAGE_INTERVAL_S
        return max(0.0, self._last_page + MIN_PAGE_INTERVAL_S - self._clock())

    def start(self) -> None:
        self.busy = True

    def done(self) -> None:
        self.busy = False
        self._last_page = self._clock()

    def _sweep(self) -> None:
        now = self._clock()
        for token in [t for t, s in self._kept.items() if now - s.created > TTL_S]:
            del self._kept[token]
