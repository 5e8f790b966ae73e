"""Importing trio-asyncio on every Python that pyproject admits (3.11 and newer).

>>> trio_asyncio = import_trio_asyncio()   # instead of `import trio_asyncio`

trio-asyncio 0.16.0, the latest release, does not import on Python 3.14 (its issue #152 is
still open): while its module body runs it subclasses two asyncio names that 3.14 removed.

- ``asyncio.events.BaseDefaultEventLoopPolicy``, the base of its ``TrioPolicy``: 3.14 renamed
  it ``_BaseDefaultEventLoopPolicy`` (the policy system is deprecated, to go in 3.16). The
  class is the same, so the old name is pointed at it.
- ``asyncio.AbstractChildWatcher``, the base of its ``TrioChildWatcher``: 3.14 removed child
  watchers altogether (the loop waits for its own children). The abstract class was only an
  interface (its methods raise ``NotImplementedError``); ``TrioChildWatcher`` implements every
  one of them itself, and on 3.14 nothing asks a policy for a watcher any more (trio-asyncio's
  own subprocess support waits with ``trio.lowlevel.wait_for_child``). An empty stand-in
  base is enough.

Once imported it still would not run a task on 3.14: asyncio's C tasks now keep the current
task per thread and step only while their loop is the thread's *running loop*
("RuntimeError: loop <TrioEventLoop> is not the running loop"). asyncio's own
``run_forever`` sets the running loop for as long as it runs; trio-asyncio's loop, which
runs inside Trio, never sets it (it answers ``get_running_loop()`` from Trio's task context
instead). So on 3.14 and later every asyncio callback of a trio-asyncio loop (a
``Handle``'s run: a task's step, a future's done-callback, a timer) runs with its loop set
as the running loop, and the previous one restored after it; callbacks of any other loop
run as before.

Each stand-in is set only when asyncio lacks the name, and removed again once trio-asyncio
is imported (the base classes are bound by then), so no other library finds the removed
names on 3.14. On 3.11-3.13 nothing is patched. The import also hides the deprecation
warnings trio-asyncio is known to raise while it loads (the child watcher on 3.12-3.13; on
3.14 the policy system: ``DefaultEventLoopPolicy``, ``get_event_loop_policy``,
``set_event_loop_policy``), so ``python -W error`` still starts the daemon.
``tests/unit/tree/test_compat.py`` takes both names out of a 3.11-3.13 asyncio and proves the
bridge then runs; docs/testing.md lists the Pythons the suites pass on.
"""

from __future__ import annotations

import asyncio
import asyncio.events
import importlib
import sys
import warnings
from collections.abc import Callable
from types import ModuleType

# trio-asyncio's known deprecations, by message (a new one still shows)
_KNOWN_DEPRECATIONS = r".*(AbstractChildWatcher|DefaultEventLoopPolicy|[gs]et_event_loop_policy).*"


class _ChildWatcherStandIn:
    """The base trio-asyncio's ``TrioChildWatcher`` names, where asyncio no longer has it."""


def _stand_ins() -> list[tuple[ModuleType, str, object]]:
    """The (module, name, value) that this Python's asyncio lacks and trio-asyncio needs."""
    missing: list[tuple[ModuleType, str, object]] = []
    if not hasattr(asyncio.events, "BaseDefaultEventLoopPolicy"):
        missing.append(
            (asyncio.events, "BaseDefaultEventLoopPolicy",
             asyncio.events._BaseDefaultEventLoopPolicy)  # type: ignore[attr-defined]
        )
    if sys.platform != "win32" and not hasattr(asyncio, "AbstractChildWatcher"):
        missing.append((asyncio, "AbstractChildWatcher", _ChildWatcherStandIn))
    return missing


def _run_handles_under_their_loop(
    trio_loop_class: type[asyncio.AbstractEventLoop],
    get_running: Callable[[], asyncio.AbstractEventLoop | None],
) -> None:
    """Make every Handle of a trio-asyncio loop run with that loop as the running loop.

    *get_running* is asyncio's own getter, as it was before trio-asyncio replaced it.
    """
    handle_class = asyncio.events.Handle
    if getattr(handle_class._run, "_under_trio_loop", False):
        return
    plain_run = handle_class._run
    set_running = asyncio.events._set_running_loop

    def _run(self: asyncio.Handle) -> None:
        loop = self._loop  # type: ignore[attr-defined]
        if not isinstance(loop, trio_loop_class):
            plain_run(self)
            return
        previous = get_running()
        set_running(loop)
        try:
            plain_run(self)
        finally:
            set_running(previous)

    _run._under_trio_loop = True  # type: ignore[attr-defined]
    handle_class._run = _run  # type: ignore[method-assign]


def import_trio_asyncio() -> ModuleType:
    """Import trio_asyncio, patched where this Python's asyncio needs it (see above)."""
    if "trio_asyncio" in sys.modules:
        return sys.modules["trio_asyncio"]
    asyncio_get_running = asyncio.events._get_running_loop  # trio-asyncio replaces it
    added = _stand_ins()
    for module, name, value in added:
        setattr(module, name, value)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings(
                "ignore", message=_KNOWN_DEPRECATIONS, category=DeprecationWarning
            )
            trio_asyncio = importlib.import_module("trio_asyncio")
    finally:
        for module, name, _value in added:
            delattr(module, name)
    if sys.version_info >= (3, 14):
        _run_handles_under_their_loop(trio_asyncio._base.BaseTrioEventLoop, asyncio_get_running)
    return trio_asyncio
