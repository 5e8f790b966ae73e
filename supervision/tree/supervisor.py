"""An OTP-style supervisor for Trio actors.

>>> spec = SupervisorSpec("jobs", [ChildSpec("a", serve_a), ChildSpec("b", serve_b)],
...                       Strategy.REST_FOR_ONE, Intensity(max_restarts=5, window=60))
>>> await nursery.start(serve_supervisor, spec)

Children start one after the other in spec order, each with ``nursery.start`` semantics
(the next starts once the previous reported ready). Each child runs inside a *shielded*
cancel scope owned by the supervisor, so only the supervisor decides when a child stops:
on shutdown it stops them in reverse start order, each with its shutdown budget. A child
runs in the supervisor's own nursery from its first moment, ready or not (not in
``nursery.start``'s: cancelled before the child was ready, ``start`` would wait for the
shielded child to end on its own, and nobody would stop it).

Restarts: PERMANENT children restart after any exit, TRANSIENT ones only after a failure,
TEMPORARY ones never. The strategy picks which siblings restart with the one that exited
(one_for_one / one_for_all / rest_for_one); siblings are stopped in reverse order and
started again in order, after a back-off (:class:`~supervision.tree.backoff.Backoff`: full
jitter over a window that doubles with each restart in the window). More than
``max_restarts`` restarts of one child within ``window`` seconds is beyond the restart
intensity: the supervisor stops every child and raises :class:`RestartIntensityExceeded`,
which its own parent handles as the failure of a child (supervisors nest); at the root it
ends the process.

What cancellation does: cancelling the supervisor's task stops its children in reverse
order, each softly (a Trio cancel: in-flight ``must_complete`` blocks finish) and, past its
``shutdown`` budget, hard (those blocks are aborted). A child being cancelled is never
restarted and never counted as a failure.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

import attrs
import structlog
import trio

from supervision.errors import SafetynetError, describe
from supervision.metrics import ACTOR_RESTARTS
from supervision.tree.shielding import StopGuard, current_guard, guarded_by
from supervision.tree.spec import ChildSpec, Restart, Strategy, SupervisorSpec

log = structlog.get_logger("supervision")


class RestartIntensityExceeded(SafetynetError):
    """A child restarted more often than its supervisor's intensity allows."""

    def __init__(self, supervisor: str, child: str, last_error: BaseException | None) -> None:
        self.supervisor, self.child, self.last_error = supervisor, child, last_error
        # The innermost actor that kept failing, through nested supervisors.
        self.actor: str = last_error.actor if isinstance(
            last_error, RestartIntensityExceeded) else child
        super().__init__(
            f"supervisor {supervisor}: child {child} exceeded its restart intensity; "
            f"last error: {describe(last_error)}"
        )


@attrs.define(eq=False)
class _Running:
    spec: ChildSpec
    guard: StopGuard
    scope: trio.CancelScope = attrs.field(factory=lambda: trio.CancelScope(shield=True))
    ready: trio.Event = attrs.field(factory=trio.Event)  # reported ready, or exited
    exited: trio.Event = attrs.field(factory=trio.Event)
    error: BaseException | None = None
    stopping: bool = False


class _Status:
    """The ``task_status`` handed to a child: tells the supervisor it is ready."""

    def __init__(self, ready: trio.Event) -> None:
        self._ready = ready

    def started(self, value: Any = None) -> None:
        self._ready.set()


Escalation = Callable[["RestartIntensityExceeded"], None]


class _Supervisor:
    def __init__(self, spec: SupervisorSpec, on_escalation: Escalation | None = None) -> None:
        self.spec = spec
        self.on_escalation = on_escalation
        self.guard = current_guard()
        self.order: list[ChildSpec] = list(spec.children)
        self.running: dict[str, _Running] = {}
        self.history: dict[str, collections.deque[float]] = collections.defaultdict(
            collections.deque)
        self.exits_send, self.exits = trio.open_memory_channel[_Running](
            max(1, len(spec.children)))
        self.nursery: trio.Nursery | None = None

    async def serve(self, task_status: trio.TaskStatus[None]) -> None:
        escalation: RestartIntensityExceeded | None = None
        async with trio.open_nursery() as nursery:
            self.nursery = nursery
            try:
                for child in list(self.order):
                    await self._start(child)
                task_status.started()
                async for running in self.exits:
                    await self._handle_exit(running)
            except RestartIntensityExceeded as exc:
                escalation = exc
                if self.on_escalation is not None:
                    self.on_escalation(exc)  # before the children stop, which takes time
            finally:
                with trio.CancelScope(shield=True):
                    await self._stop_all()
        if escalation is not None:
            log.error("supervisor_escalated", supervisor=self.spec.name,
                      actor=escalation.actor, error=describe(escalation.last_error))
            raise escalation

    async def _start(self, child: ChildSpec) -> None:
        """Start *child* and wait until it is ready. If that wait is cancelled, the child
        is already ours to stop (it is in ``running``): ``_stop_all`` stops it."""
        assert self.nursery is not None
        running = _Running(child, self.guard.child())
        self.running[child.name] = running
        self.nursery.start_soon(self._child_task, running)
        await running.ready.wait()

    async def _child_task(self, running: _Running) -> None:
        try:
            with guarded_by(running.guard), running.scope:
                try:
                    await running.spec.start(task_status=_Status(running.ready))
                except Exception as exc:
                    running.error = exc
        finally:
            running.ready.set()  # a child that died before it was ready unblocks _start()
            running.guard.detach()
            running.exited.set()
        if not running.stopping:
            self.exits_send.send_nowait(running)

    async def _handle_exit(self, running: _Running) -> None:
        child = running.spec
        if self.running.get(child.name) is not running:
            return  # stale: that incarnation was already stopped and replaced
        failed = running.error is not None
        event = "actor_failed" if failed else "actor_exited"
        (log.error if failed else log.info)(
            event, supervisor=self.spec.name, actor=child.name, error=describe(running.error))
        restart = child.restart is Restart.PERMANENT or (
            child.restart is Restart.TRANSIENT and failed)
        if not restart:
            self._forget(child)
            return
        history = self.history[child.name]
        now = trio.current_time()
        while history and history[0] <= now - self.spec.intensity.window:
            history.popleft()
        if len(history) >= self.spec.intensity.max_restarts:
            raise RestartIntensityExceeded(self.spec.name, child.name, running.error)
        history.append(now)

        group = self._restart_group(child)
        for other in reversed(group):
            if other is not child:
                await self._stop(self.running[other.name])
        delay = self.spec.intensity.delay(len(history))
        await trio.sleep(delay)
        for member in group:
            if member is not child and member.restart is Restart.TEMPORARY:
                self._forget(member)
                continue
            ACTOR_RESTARTS.labels(actor=member.name).inc()
            log.warning("actor_restarted", supervisor=self.spec.name, actor=member.name,
                        cause=child.name, restarts_in_window=len(history),
                        backoff_s=round(delay, 3))
            await self._start(member)

    def _restart_group(self, child: ChildSpec) -> list[ChildSpec]:
        if self.spec.strategy is Strategy.ONE_FOR_ONE:
            return [child]
        if self.spec.strategy is Strategy.ONE_FOR_ALL:
            return list(self.order)
        return self.order[self.order.index(child):]

    def _forget(self, child: ChildSpec) -> None:
        self.order.remove(child)
        self.running.pop(child.name, None)

    async def _stop(self, running: _Running) -> None:
        """Soft stop, then hard stop once the child's shutdown budget is spent."""
        running.stopping = True
        running.scope.cancel()
        with trio.move_on_after(running.spec.shutdown):
            await running.exited.wait()
        if not running.exited.is_set():
            log.warning("actor_shutdown_overran", supervisor=self.spec.name,
                        actor=running.spec.name, budget_s=running.spec.shutdown,
                        in_flight=running.guard.in_flight)
            running.guard.hard_stop()
            await running.exited.wait()

    async def _stop_all(self) -> None:
        for child in reversed(self.order):
            running = self.running.get(child.name)
            if running is not None and not running.exited.is_set():
                await self._stop(running)


async def serve_supervisor(
    spec: SupervisorSpec, *, on_escalation: Escalation | None = None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run *spec*'s children until cancelled; raise if one exceeds the restart intensity
    (*on_escalation* is told first, before the children are stopped)."""
    await _Supervisor(spec, on_escalation).serve(task_status)
