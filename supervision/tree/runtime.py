"""The root of the process: signals, graceful shutdown, exit codes.

>>> exit_code = trio.run(serve_root, tree_spec, 10.0)

Shutdown, step by step:

1. First SIGTERM/SIGINT: the root supervisor is cancelled. Claimers stop at their next
   checkpoint (no new work is claimed); every in-flight ``must_complete`` block (a row's
   or a batch's transaction) runs to commit or rollback; supervisors stop their children
   in reverse start order; lock keepers release their advisory locks; pools close.
2. ``shutdown_grace`` after the first signal, whatever is still running is hard-stopped
   (PostgreSQL cancel requests: unfinished transactions roll back).
3. A second signal hard-stops at once.

From the first signal (or the root's escalation) on, ``/healthz`` and ``/readyz`` answer
503 (:data:`~supervision.tree.health.HEALTH`).

Once the tree has stopped, the caller's teardown (closing pools) is short and bounded, and
a late signal must not turn a clean stop into a kill (-15) or a KeyboardInterrupt
traceback: inside :func:`quiet_teardown`, SIGTERM/SIGINT stay ignored from serve_root's
return until the block exits, which puts the previous handlers back. Without it, serve_root
leaves the handlers as it found them.

Reload (SIGHUP, when the caller passes *reload*): the caller re-reads its configuration
and returns a :data:`Successor` — how to build the tree to run from now on (or None:
refused or unchanged, the tree runs on). The running tree is then stopped as on a
SIGTERM, but only the tree: in-flight ``must_complete`` blocks commit, lock keepers
release their locks, and ``shutdown_grace`` later whatever still runs of it is
hard-stopped; then the successor is awaited — between the two trees nothing uses the
resources they share, so it may swap some of them — and the tree it returns starts in
the same process. ``/healthz`` stays up meanwhile (the exporter is a child: it is down
for the moment between the two trees). A SIGHUP while the old tree is still stopping
replaces the successor waiting to run (one arriving while a successor runs is run right
after it, and its tree starts); a SIGHUP during shutdown is ignored, and a shutdown
requested while a successor runs starts no new tree. The reload itself (reading and
checking the files) runs in a task of its own: signals are handled meanwhile, a SIGHUP
arriving during it runs one more reload after it, and SIGTERM/SIGINT abandon it.

Under systemd (``Type=notify``, deploy/systemd): READY=1 once every child of the tree has
started (again after a reload, which first sends RELOADING=1), STOPPING=1 on the first
signal or an escalation, and, with ``WatchdogSec``, WATCHDOG=1 at half the interval for as
long as ``/healthz`` would answer 200 (:mod:`supervision.tree.systemd_notify`).

Exit codes: 0 after a graceful stop; 1 when the tree failed (a child beyond its restart
intensity, logged with the actor's name and last error).
"""

from __future__ import annotations

import contextlib
import contextvars
import signal
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import attrs
import structlog
import trio

from supervision.errors import describe, first_leaf
from supervision.tree.health import HEALTH, RootState
from supervision.tree.shielding import StopGuard, guarded_by
from supervision.tree.spec import SupervisorSpec
from supervision.tree.supervisor import RestartIntensityExceeded, serve_supervisor
from supervision.tree.systemd_notify import notify, serve_watchdog, watchdog_interval
from supervision.tree.systemd_notify import reloading as notify_reloading

log = structlog.get_logger("runtime")

EXIT_OK = 0
EXIT_FAILED = 1
SHUTDOWN_SIGNALS = (signal.SIGTERM, signal.SIGINT)
RELOAD_SIGNAL = signal.SIGHUP

# Called once the old tree has stopped: may swap shared resources, returns the new tree.
Successor = Callable[[], Awaitable[SupervisorSpec]]
Reload = Callable[[], Awaitable[Successor | None]]

_QUIET_TEARDOWN = contextvars.ContextVar("quiet_teardown", default=False)


@contextlib.contextmanager
def quiet_teardown() -> Iterator[None]:
    """Around serve_root and the teardown after it: late SIGTERM/SIGINT are ignored from
    serve_root's return until this block exits, SIGHUP whenever serve_root is not
    running; then the handlers in force at entry are back."""
    previous = {signum: signal.getsignal(signum)
                for signum in (*SHUTDOWN_SIGNALS, RELOAD_SIGNAL)}
    token = _QUIET_TEARDOWN.set(True)
    signal.signal(RELOAD_SIGNAL, signal.SIG_IGN)  # before and after the tree: no reload
    try:
        yield
    finally:
        _QUIET_TEARDOWN.reset(token)
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@attrs.define(eq=False)
class _Generation:
    """One run of a tree: the scope that stops it softly, the guard that hard-stops it."""

    spec: SupervisorSpec
    guard: StopGuard
    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    done: trio.Event = attrs.field(factory=trio.Event)
    successor: Successor | None = None  # a reload's tree, built once this one ends


async def serve_root(tree: SupervisorSpec, shutdown_grace: float,
                     reload: Reload | None = None) -> int:
    """Run *tree* until a signal stops it (0) or it fails (1); with *reload*, SIGHUP
    swaps the tree for the one *reload* returns (see the module docstring)."""
    HEALTH.set_root(RootState.RUNNING)
    root = _Root(tree, shutdown_grace, reload)
    signums = (*SHUTDOWN_SIGNALS, RELOAD_SIGNAL) if reload is not None else SHUTDOWN_SIGNALS
    failure: RestartIntensityExceeded | None = None
    try:
        with guarded_by(root.guard), trio.open_signal_receiver(*signums) as signals:
            async with trio.open_nursery() as nursery:
                await root.serve(nursery, signals)
    except* RestartIntensityExceeded as group:
        failure = first_leaf(group, RestartIntensityExceeded)
    finally:
        if _QUIET_TEARDOWN.get():  # quiet_teardown() puts the handlers back after it
            for signum in (*SHUTDOWN_SIGNALS, RELOAD_SIGNAL):
                signal.signal(signum, signal.SIG_IGN)
    if failure is not None:
        log.critical("daemon_failed", actor=failure.actor, supervisor=failure.supervisor,
                     error=describe(failure.last_error))
        return EXIT_FAILED
    log.info("daemon_stopped")
    return EXIT_OK


@attrs.define(eq=False)
class _Root:
    """The root's state while it serves: the tree running now (a generation), the signal
    loop's decisions, and the reload task's two flags."""

    tree: SupervisorSpec
    shutdown_grace: float
    reload: Reload | None
    guard: StopGuard = attrs.field(factory=StopGuard)
    current: _Generation = attrs.field(init=False)
    shutting_down: trio.Event = attrs.field(factory=trio.Event)
    reload_scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    reload_running: bool = False
    reload_again: bool = False  # a SIGHUP came in while a reload was running
    nursery: trio.Nursery = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.current = _Generation(self.tree, self.guard.child())

    async def serve(self, nursery: trio.Nursery,
                    signals: AsyncIterator[int]) -> None:
        self.nursery = nursery
        nursery.start_soon(self.run_trees)
        watchdog = watchdog_interval()
        if watchdog is not None:  # systemd's WatchdogSec (deploy/systemd)
            nursery.start_soon(serve_watchdog, _healthy, watchdog)
        log.info("daemon_started", supervisor=self.tree.name)
        async for signum in signals:
            if signum == RELOAD_SIGNAL:
                self.on_reload_signal()
            else:
                self.on_stop_signal(signal.Signals(signum).name)

    def escalating(self, exc: RestartIntensityExceeded) -> None:
        HEALTH.set_root(RootState.ESCALATING, f"{exc.actor} exceeded its restart intensity")
        notify("STOPPING=1", f"STATUS={exc.actor} exceeded its restart intensity")

    async def run_trees(self) -> None:
        """The current tree, then each successor a reload handed over, until shutdown."""
        while True:
            current = self.current
            try:
                with current.scope, guarded_by(current.guard):
                    await serve_supervisor(current.spec, on_escalation=self.escalating,
                                           task_status=_TreeRunning(current.spec))
            finally:
                current.guard.detach()
                current.done.set()
            if self.shutting_down.is_set() or current.successor is None:
                break
            spec = await self.next_spec(current)
            if self.shutting_down.is_set():
                break
            self.current = _Generation(spec, self.guard.child())
            log.info("tree_restarted", supervisor=spec.name)
        self.nursery.cancel_scope.cancel()

    @staticmethod
    async def next_spec(ended: _Generation) -> SupervisorSpec:
        """The ended tree's successor built; a SIGHUP meanwhile replaced it: build that."""
        successor = ended.successor
        assert successor is not None
        spec = await successor()
        while ended.successor is not successor:
            successor = ended.successor
            assert successor is not None
            spec = await successor()
        return spec

    def on_reload_signal(self) -> None:
        if self.shutting_down.is_set():
            log.info("reload_ignored", signal=RELOAD_SIGNAL.name, reason="shutting down")
        elif self.reload_running:  # one more once this one is done
            self.reload_again = True
        else:
            self.reload_running = True
            self.reload_scope = trio.CancelScope()
            self.nursery.start_soon(self.run_reloads)

    def on_stop_signal(self, name: str) -> None:
        if self.shutting_down.is_set():
            log.warning("shutdown_forced", signal=name, in_flight=self.guard.in_flight)
            self.guard.hard_stop()
            return
        self.shutting_down.set()
        self.reload_scope.cancel()  # a reload still reading is abandoned
        log.info("shutdown_requested", signal=name, grace_s=self.shutdown_grace)
        HEALTH.set_root(RootState.SHUTTING_DOWN, name)
        notify("STOPPING=1", f"STATUS=stopping on {name}")
        self.current.scope.cancel()
        self.nursery.start_soon(self.hard_stop_after_grace)

    async def run_reloads(self) -> None:
        """Reloads one after another while SIGHUPs came in meanwhile; in a task of its
        own, so the signal loop goes on (a SIGTERM cancels it)."""
        assert self.reload is not None
        with self.reload_scope:
            while True:
                self.reload_again = False
                successor = await self.reload()
                if successor is not None and not self.shutting_down.is_set():
                    self.hand_over(successor)
                if not self.reload_again or self.shutting_down.is_set():
                    break
        self.reload_running = False

    def hand_over(self, successor: Successor) -> None:
        """The running tree stops softly (hard after the grace) and *successor* follows;
        a tree already stopping for an earlier reload just gets the newer successor."""
        current = self.current
        stopping = current.successor is not None
        current.successor = successor
        notify_reloading()  # READY=1 again once the new tree runs
        if not stopping:
            current.scope.cancel()
            self.nursery.start_soon(self.hard_stop_generation_after_grace, current)

    async def hard_stop_after_grace(self) -> None:
        await trio.sleep(self.shutdown_grace)
        if self.guard.in_flight:
            log.warning("shutdown_grace_expired", in_flight=self.guard.in_flight)
        self.guard.hard_stop()

    async def hard_stop_generation_after_grace(self, old: _Generation) -> None:
        with trio.move_on_after(self.shutdown_grace) as waited:
            await old.done.wait()
        if waited.cancelled_caught:
            log.warning("reload_grace_expired", in_flight=old.guard.in_flight)
            old.guard.hard_stop()


@attrs.frozen
class _TreeRunning:
    """The root tree's ``task_status``: once every child started, systemd hears READY=1."""

    spec: SupervisorSpec

    def started(self, value: object = None) -> None:
        notify("READY=1", f"STATUS=tree {self.spec.name} running")


def _healthy() -> bool:
    """The watchdog's check: the one ``/healthz`` answers (the root runs the tree)."""
    return HEALTH.liveness_reason() is None
