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
from collections.abc import Awaitable, Callable, Iterator

import attrs
import structlog
import trio

from supervision.tree.health import HEALTH, RootState
from supervision.tree.shielding import StopGuard, guarded_by
from supervision.tree.spec import SupervisorSpec
from supervision.tree.supervisor import RestartIntensityExceeded, describe, serve_supervisor
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
    guard = StopGuard()
    failure: RestartIntensityExceeded | None = None
    HEALTH.set_root(RootState.RUNNING)
    signums = (*SHUTDOWN_SIGNALS, RELOAD_SIGNAL) if reload is not None else SHUTDOWN_SIGNALS

    def escalating(exc: RestartIntensityExceeded) -> None:
        HEALTH.set_root(RootState.ESCALATING, f"{exc.actor} exceeded its restart intensity")
        notify("STOPPING=1", f"STATUS={exc.actor} exceeded its restart intensity")
    try:
        with guarded_by(guard), trio.open_signal_receiver(*signums) as signals:
            async with trio.open_nursery() as nursery:
                current = _Generation(tree, guard.child())
                shutting_down = trio.Event()  # set by the signal loop, read by run_trees

                async def run_trees() -> None:
                    nonlocal current
                    while True:
                        try:
                            with current.scope, guarded_by(current.guard):
                                await serve_supervisor(current.spec, on_escalation=escalating,
                                                       task_status=_TreeRunning(current.spec))
                        finally:
                            current.guard.detach()
                            current.done.set()
                        if shutting_down.is_set() or current.successor is None:
                            break
                        successor = current.successor
                        spec = await successor()
                        while current.successor is not successor:  # a SIGHUP meanwhile
                            successor = current.successor
                            spec = await successor()
                        if shutting_down.is_set():
                            break
                        current = _Generation(spec, guard.child())
                        log.info("tree_restarted", supervisor=current.spec.name)
                    nursery.cancel_scope.cancel()

                async def hard_stop_after_grace() -> None:
                    await trio.sleep(shutdown_grace)
                    if guard.in_flight:
                        log.warning("shutdown_grace_expired", in_flight=guard.in_flight)
                    guard.hard_stop()

                async def hard_stop_generation_after_grace(old: _Generation) -> None:
                    with trio.move_on_after(shutdown_grace) as waited:
                        await old.done.wait()
                    if waited.cancelled_caught:
                        log.warning("reload_grace_expired", in_flight=old.guard.in_flight)
                        old.guard.hard_stop()

                reload_scope = trio.CancelScope()
                reload_state = {"running": False, "again": False}

                async def run_reloads() -> None:
                    """Reloads one after another while SIGHUPs came in meanwhile; in a
                    task of its own, so the signal loop goes on (a SIGTERM cancels it)."""
                    assert reload is not None
                    with reload_scope:
                        while True:
                            reload_state["again"] = False
                            successor = await reload()
                            if successor is not None and not shutting_down.is_set():
                                stopping = current.successor is not None
                                current.successor = successor
                                notify_reloading()  # READY=1 again once the new tree runs
                                if not stopping:
                                    current.scope.cancel()
                                    nursery.start_soon(hard_stop_generation_after_grace,
                                                       current)
                            if not reload_state["again"] or shutting_down.is_set():
                                break
                    reload_state["running"] = False

                nursery.start_soon(run_trees)
                watchdog = watchdog_interval()
                if watchdog is not None:  # systemd's WatchdogSec (deploy/systemd)
                    nursery.start_soon(serve_watchdog, _healthy, watchdog)
                log.info("daemon_started", supervisor=tree.name)
                async for signum in signals:
                    name = signal.Signals(signum).name
                    if signum == RELOAD_SIGNAL:
                        if shutting_down.is_set():
                            log.info("reload_ignored", signal=name, reason="shutting down")
                        elif reload_state["running"]:  # one more once this one is done
                            reload_state["again"] = True
                        else:
                            reload_state["running"] = True
                            reload_scope = trio.CancelScope()
                            nursery.start_soon(run_reloads)
                    elif not shutting_down.is_set():
                        shutting_down.set()
                        reload_scope.cancel()  # a reload still reading is abandoned
                        log.info("shutdown_requested", signal=name,
                                 grace_s=shutdown_grace)
                        HEALTH.set_root(RootState.SHUTTING_DOWN, name)
                        notify("STOPPING=1", f"STATUS=stopping on {name}")
                        current.scope.cancel()
                        nursery.start_soon(hard_stop_after_grace)
                    else:
                        log.warning("shutdown_forced", signal=name, in_flight=guard.in_flight)
                        guard.hard_stop()
    except* RestartIntensityExceeded as group:
        failure = _first_leaf(group)
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


@attrs.frozen
class _TreeRunning:
    """The root tree's ``task_status``: once every child started, systemd hears READY=1."""

    spec: SupervisorSpec

    def started(self, value: object = None) -> None:
        notify("READY=1", f"STATUS=tree {self.spec.name} running")


def _healthy() -> bool:
    """The watchdog's check: the one ``/healthz`` answers (the root runs the tree)."""
    return HEALTH.liveness_reason() is None


def _first_leaf(group: BaseExceptionGroup[RestartIntensityExceeded]) -> RestartIntensityExceeded:
    exc: BaseException = group
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    assert isinstance(exc, RestartIntensityExceeded)
    return exc
