"""The dev stack's child processes: forked from one long-lived thread, each in its own
process group with ``PR_SET_PDEATHSIG``, stopped gracefully then forcefully, and all of
them stopped at exit: children never outlive us."""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Protocol, TypeVar

import httpx
import psycopg

from supervision.errors import SafetynetError

_T = TypeVar("_T")
START_TIMEOUT = 60.0
STOP_GRACE = 5.0


class DevStackError(SafetynetError):
    """A dev-stack server failed to start (the message carries the tail of its log)."""





# --- child processes -------------------------------------------------------------------

_LIBC = ctypes.CDLL(None, use_errno=True)
_PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int) -> Callable[[], None]:
    def preexec() -> None:  # runs in the child after fork (and after setuid), before exec
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent_pid:  # parent died before prctl took effect
            os.kill(os.getpid(), signal.SIGKILL)

    return preexec


class _Spawner:
    """Forks every child from one long-lived daemon thread.

    PR_SET_PDEATHSIG fires when the *thread* that forked the child exits, not the process:
    a child forked from a short-lived worker thread (parallel start-up, trio's
    ``to_thread``) would be SIGKILLed as soon as that thread finished.
    """

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def run(self, fn: Callable[[], _T]) -> _T:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="devstack-spawner")
                self._thread.daemon = True
                self._thread.start()
        fut: Future[_T] = Future()

        def job() -> None:
            try:
                fut.set_result(fn())
            except BaseException as exc:  # handed back to the caller
                fut.set_exception(exc)

        self._jobs.put(job)
        return fut.result()

    def _loop(self) -> None:
        while True:
            self._jobs.get()()


_SPAWNER = _Spawner()
_LIVE: set[Child] = set()
_LIVE_LOCK = threading.Lock()


class Child:
    """One server process: own process group, log file, graceful-then-forceful stop."""

    def __init__(self, name: str, log_path: Path, stop_signal: int = signal.SIGTERM) -> None:
        self.name, self.log_path, self.stop_signal = name, log_path, stop_signal
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, argv: list[str], env: dict[str, str] | None = None, uid: int | None = None,
              gid: int | None = None) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            log.write(f"\n--- devstack: starting {argv}\n".encode())
            log.flush()
            preexec = die_with_parent(os.getpid())
            self.proc = _SPAWNER.run(lambda: subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                start_new_session=True, preexec_fn=preexec, user=uid, group=gid,
                extra_groups=[] if uid is not None else None,
            ))
        with _LIVE_LOCK:
            _LIVE.add(self)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None

    def check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise self.error(f"exited with status {self.proc.returncode} during start-up")

    def error(self, what: str) -> DevStackError:
        try:
            tail = self.log_path.read_text(errors="replace").splitlines()[-40:]
        except OSError:
            tail = []
        return DevStackError(f"{self.name} {what}; tail of {self.log_path}:\n" + "\n".join(tail))

    def kill(self) -> None:
        """SIGKILL the whole process group now (a crash, for fault tests) and reap it."""
        self._killpg(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait()

    def _killpg(self, sig: int) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, sig)  # pgid == pid (start_new_session)


def stop_children(children: Iterable[Child], grace: float = STOP_GRACE) -> None:
    """Signal all leaders at once, wait up to ``grace`` s, SIGKILL each whole process group."""
    procs = [c for c in children if c.proc is not None]
    try:
        for c in procs:
            assert c.proc is not None
            if c.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    c.proc.send_signal(c.stop_signal)
        deadline = time.monotonic() + grace
        for c in procs:
            assert c.proc is not None
            with contextlib.suppress(subprocess.TimeoutExpired):
                c.proc.wait(max(0.0, deadline - time.monotonic()))
    finally:  # also on KeyboardInterrupt: nothing may survive
        for c in procs:
            c._killpg(signal.SIGKILL)
            assert c.proc is not None
            c.proc.wait()
            c.proc = None
            with _LIVE_LOCK:
                _LIVE.discard(c)


@atexit.register
def _stop_everything() -> None:
    with _LIVE_LOCK:
        live = list(_LIVE)
    stop_children(live)


def wait_until(child: Child, probe: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        child.check_alive()
        try:
            if probe():
                return
        except (OSError, psycopg.Error, httpx.HTTPError):
            pass
        if time.monotonic() > deadline:
            raise child.error(f"not ready after {timeout:.0f}s")
        time.sleep(0.05)


# --- servers ---------------------------------------------------------------------------


class Server(Protocol):
    def start(self) -> None: ...
    def stop(self) -> None: ...




def start_all(servers: Iterable[Server]) -> None:
    """Start servers in parallel threads; on any failure stop them all and re-raise."""
    todo = list(servers)
    try:
        with ThreadPoolExecutor(max(1, len(todo))) as pool:
            futures = [pool.submit(s.start) for s in todo]
            errors = [f.exception() for f in futures]
        failure = next((e for e in errors if e is not None), None)
        if failure is not None:
            raise failure
    except BaseException:  # including KeyboardInterrupt while waiting
        stop_all(todo)
        raise


def stop_all(servers: Iterable[Server]) -> None:
    """Stop servers in parallel (each waits for its own grace period)."""
    todo = list(servers)
    with ThreadPoolExecutor(max(1, len(todo))) as pool:
        for future in [pool.submit(s.stop) for s in todo]:
            future.result()

