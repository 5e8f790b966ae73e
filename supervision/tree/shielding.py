"""Finish-or-abort: the one primitive for "this block must complete or roll back as a whole".

>>> async def commit_row(db, row):
...     async with must_complete():
...         await db.atomic(apply_outcome, row)   # runs to COMMIT even if we are cancelled

Cancellation in safetynet has two strengths:

* **Soft stop** — an ordinary Trio cancellation (SIGTERM, a sibling restart, losing the
  advisory lock). Everything stops at its next checkpoint *except* blocks under
  :func:`must_complete`: they are shielded and run to their end, so a row's transaction
  commits or rolls back whole, never half.
* **Hard stop** — the shutdown grace ran out, a second SIGTERM arrived, or a child overran
  its shutdown budget. :meth:`StopGuard.hard_stop` cancels every shielded block beneath
  that guard and fires their abort callbacks (for PostgreSQL: a cancel request, so the
  server rolls the transaction back). Still never half-written: PostgreSQL rolls back what
  did not commit.

Guards form a tree that mirrors the supervision tree: the supervisor gives each child a
guard under its own (through a context variable that Trio copies into every task the
child spawns), so hard-stopping a subtree reaches every block inside it.
"""

from __future__ import annotations

import contextvars
import math
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager

import trio

from supervision.errors import SafetynetError


class WorkAbandoned(SafetynetError):
    """A must-complete block was hard-stopped before it finished; its transaction rolled back."""


class StopGuard:
    """The shielded blocks and abort callbacks of one subtree of actors."""

    def __init__(self, parent: StopGuard | None = None) -> None:
        self._scopes: set[trio.CancelScope] = set()
        self._aborts: set[Callable[[], None]] = set()
        self._children: set[StopGuard] = set()
        self._parent = parent
        self.stopped = False
        if parent is not None:
            parent._children.add(self)
            self.stopped = parent.stopped

    def child(self) -> StopGuard:
        """A guard for a sub-tree; hard-stopping this guard reaches it too."""
        return StopGuard(self)

    def detach(self) -> None:
        """Forget this guard in its parent (its subtree has exited)."""
        if self._parent is not None:
            self._parent._children.discard(self)

    @property
    def in_flight(self) -> int:
        """How many shielded blocks are running in this subtree."""
        return len(self._scopes) + sum(c.in_flight for c in self._children)

    def hard_stop(self) -> None:
        """Abort every shielded block in this subtree now (idempotent)."""
        self.stopped = True
        for abort in list(self._aborts):
            abort()
        for scope in list(self._scopes):
            scope.cancel()
        for child in list(self._children):
            child.hard_stop()

    @contextmanager
    def on_hard_stop(self, abort: Callable[[], None]) -> Iterator[None]:
        """Call *abort* (from the Trio thread) if this subtree is hard-stopped meanwhile."""
        self._aborts.add(abort)
        try:
            if self.stopped:
                abort()
            yield
        finally:
            self._aborts.discard(abort)


_root_guard = StopGuard()
_current: contextvars.ContextVar[StopGuard] = contextvars.ContextVar(
    "safetynet_stop_guard", default=_root_guard
)


def current_guard() -> StopGuard:
    """The guard of the actor this task belongs to."""
    return _current.get()


@contextmanager
def guarded_by(guard: StopGuard) -> Iterator[StopGuard]:
    """Make *guard* the current one for this task and every task it spawns from here."""
    token = _current.set(guard)
    try:
        yield guard
    finally:
        _current.reset(token)


@asynccontextmanager
async def must_complete(limit: float = math.inf) -> AsyncIterator[trio.CancelScope]:
    """Run the block to its end despite soft cancellation; abort it only on a hard stop.

    *limit* (seconds) bounds the block on its own (``trio.TooSlowError`` when exceeded).

    What cancellation does: a cancellation from outside waits for the block, then is
    delivered at the first checkpoint after it. A hard stop of the current guard
    cancels the block; it then raises :class:`WorkAbandoned` (or the pending outer
    ``Cancelled``), and whatever the block wrote without committing is rolled back by
    the database.
    """
    guard = current_guard()
    with trio.CancelScope(shield=True) as scope:
        if limit != math.inf:
            scope.deadline = trio.current_time() + limit
        guard._scopes.add(scope)
        try:
            if guard.stopped:
                scope.cancel()
            yield scope
        finally:
            guard._scopes.discard(scope)
    if scope.cancelled_caught:
        await trio.lowlevel.checkpoint()  # delivers an outer cancellation, if any
        if guard.stopped:
            raise WorkAbandoned()
        raise trio.TooSlowError()
