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
503 (:data:`~supervision.health.HEALTH`).

Once the tree has stopped, the caller's teardown (closing pools) is short and bounded, and
a late signal must not turn a clean stop into a kill (-15) or a KeyboardInterrupt
traceback: inside :func:`quiet_teardown`, SIGTERM/SIGINT stay ignored from serve_root's
return until the block exits, which puts the previous handlers back. Without it, serve_root
leaves the handlers as it found them.

Exit codes: 0 after a graceful stop; 1 when the tree failed (a child beyond its restart
intensity, logged with the actor's name and last error).
"""

from __future__ import annotations

import contextlib
import contextvars
import signal
from collections.abc import Iterator

import structlog
import trio

from supervision.health import HEALTH, RootState
from supervision.shielding import StopGuard, guarded_by
from supervision.spec import SupervisorSpec
from supervision.supervisor import RestartIntensityExceeded, describe, serve_supervisor

log = structlog.get_logger("runtime")

EXIT_OK = 0
EXIT_FAILED = 1
SHUTDOWN_SIGNALS = (signal.SIGTERM, signal.SIGINT)

_QUIET_TEARDOWN = contextvars.ContextVar("quiet_teardown", default=False)


@contextlib.contextmanager
def quiet_teardown() -> Iterator[None]:
    """Around serve_root and the teardown after it: late SIGTERM/SIGINT are ignored from
    serve_root's return until this block exits; then the handlers in force at entry are
    back."""
    previous = {signum: signal.getsignal(signum) for signum in SHUTDOWN_SIGNALS}
    token = _QUIET_TEARDOWN.set(True)
    try:
        yield
    finally:
        _QUIET_TEARDOWN.reset(token)
        for signum, handler in previous.items():
            signal.signal(signum, handler)


async def serve_root(tree: SupervisorSpec, shutdown_grace: float) -> int:
    """Run *tree* until a signal stops it (0) or it fails (1)."""
    guard = StopGuard()
    failure: RestartIntensityExceeded | None = None
    HEALTH.set_root(RootState.RUNNING)

    def escalating(exc: RestartIntensityExceeded) -> None:
        HEALTH.set_root(RootState.ESCALATING, f"{exc.actor} exceeded its restart intensity")
    try:
        with guarded_by(guard), trio.open_signal_receiver(*SHUTDOWN_SIGNALS) as signals:
            async with trio.open_nursery() as nursery:
                tree_scope = trio.CancelScope()

                async def run_tree() -> None:
                    with tree_scope:
                        await serve_supervisor(tree, on_escalation=escalating)
                    nursery.cancel_scope.cancel()

                async def hard_stop_after_grace() -> None:
                    await trio.sleep(shutdown_grace)
                    if guard.in_flight:
                        log.warning("shutdown_grace_expired", in_flight=guard.in_flight)
                    guard.hard_stop()

                nursery.start_soon(run_tree)
                log.info("daemon_started", supervisor=tree.name)
                async for signum in signals:
                    name = signal.Signals(signum).name
                    if not tree_scope.cancel_called:
                        log.info("shutdown_requested", signal=name,
                                 grace_s=shutdown_grace)
                        HEALTH.set_root(RootState.SHUTTING_DOWN, name)
                        tree_scope.cancel()
                        nursery.start_soon(hard_stop_after_grace)
                    else:
                        log.warning("shutdown_forced", signal=name, in_flight=guard.in_flight)
                        guard.hard_stop()
    except* RestartIntensityExceeded as group:
        failure = _first_leaf(group)
    finally:
        if _QUIET_TEARDOWN.get():  # quiet_teardown() puts the handlers back after it
            for signum in SHUTDOWN_SIGNALS:
                signal.signal(signum, signal.SIG_IGN)
    if failure is not None:
        log.critical("daemon_failed", actor=failure.actor, supervisor=failure.supervisor,
                     error=describe(failure.last_error))
        return EXIT_FAILED
    log.info("daemon_stopped")
    return EXIT_OK


def _first_leaf(group: BaseExceptionGroup[RestartIntensityExceeded]) -> RestartIntensityExceeded:
    exc: BaseException = group
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    assert isinstance(exc, RestartIntensityExceeded)
    return exc
