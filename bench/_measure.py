"""Measurement helpers shared by the benchmarks (not a benchmark itself).

* :class:`CpuMeter` — CPU seconds spent by this process, by server process trees (a
  postmaster and its backends, a weed, a broker) and by reaped children (pgbench) between
  two points, so a run can say where the machine's cores went; :func:`backends_gone`
  waits until a postmaster has reaped its client backends, so a session closed before
  the first point is not charged to the interval (its CPU moves to the postmaster's
  ``children_*`` times when it is reaped);
* :class:`RssSampler` — the peak resident set size of this process while a block runs
  (psutil every 10 ms, plus ``ru_maxrss`` for the lifetime peak);
* :class:`TimedDatabase` — a stand-in for :class:`supervision.db.database.Database` that
  times every unit of work on both sides of the thread crossing: before the function runs
  in its worker thread (dispatch + pool checkout with its check query + BEGIN), the function
  itself (its statements), and after it (COMMIT + check-in + the way back into Trio);
* :func:`py_spy` / :func:`py_spy_report` — a sampled CPU profile of every thread of this
  process (py-spy, optional: ``pip install py-spy``) as a short table.
"""

from __future__ import annotations

import contextlib
import os
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import psutil


def tree_cpu(pid: int) -> float:
    """User + system seconds of *pid*, its reaped children and its live descendants.

    Read again when *pid* reaped a child while its descendants were read (its
    ``children_*`` times moved): that child's CPU was then in neither reading, or in both."""
    try:
        proc = psutil.Process(pid)
        for _ in range(10):
            t = proc.cpu_times()
            total = t.user + t.system + t.children_user + t.children_system
            for child in proc.children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    ct = child.cpu_times()
                    total += ct.user + ct.system
            after = proc.cpu_times()
            if (after.children_user, after.children_system) == (t.children_user,
                                                                t.children_system):
                break
        return float(total)
    except psutil.Error:
        return 0.0


def _self_cpu() -> float:
    t = psutil.Process().cpu_times()
    return float(t.user + t.system)


def _reaped_children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return float(ru.ru_utime + ru.ru_stime)


def backends_gone(postmaster: int, limit_s: float = 5.0) -> bool:
    """Wait until *postmaster* (or the process above it) has no client backend (a process
    titled ``... 127.0.0.1`` or ``[local]``), no autovacuum worker and no unreaped child,
    at most *limit_s*; whether it got there."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            children = psutil.Process(postmaster).children(recursive=True)
        except psutil.Error:
            return False
        if not any(_client_or_zombie(child) for child in children):
            return True
        time.sleep(0.01)
    return False


def _client_or_zombie(proc: psutil.Process) -> bool:
    try:
        if proc.status() == psutil.STATUS_ZOMBIE:
            return True
        title = " ".join(proc.cmdline())
    except psutil.Error:
        return True  # exiting right now: look again
    return "127.0.0.1" in title or "[local]" in title or "autovacuum worker" in title


class CpuMeter:
    """CPU seconds per component between :meth:`start` and :meth:`stop` (plus wall time).

    With *settled* (e.g. ``partial(backends_gone, postmaster)``), :meth:`start` waits
    for it before the first snapshot and :meth:`stop` after its *settle_s* sleep."""

    def __init__(self, servers: dict[str, int | None],
                 settled: Callable[[], object] | None = None) -> None:
        self.servers = {name: pid for name, pid in servers.items() if pid}
        self._settled = settled
        self._t0: dict[str, float] = {}
        self.used: dict[str, float] = {}
        self.wall = 0.0

    def _snapshot(self) -> dict[str, float]:
        snap = {"python": _self_cpu(), "children": _reaped_children_cpu()}
        snap.update({name: tree_cpu(pid) for name, pid in self.servers.items()})
        snap["wall"] = time.perf_counter()
        return snap

    def start(self) -> None:
        if self._settled is not None:
            self._settled()
        self._t0 = self._snapshot()

    def stop(self, settle_s: float = 0.3) -> None:
        """Wall time now; CPU after *settle_s*, once the postmaster has reaped the backends
        of pools closed at the end (their CPU moves to its children_* times)."""
        wall = time.perf_counter() - self._t0["wall"]
        time.sleep(settle_s)
        if self._settled is not None:
            self._settled()
        t1 = self._snapshot()
        t1.pop("wall")
        self.wall = wall
        self.used = {name: t1[name] - self._t0[name] for name in t1}

    @contextlib.contextmanager
    def measure(self) -> Iterator[CpuMeter]:
        self.start()
        try:
            yield self
        finally:
            self.stop()

    def cores(self) -> float:
        """CPU seconds of every measured component per wall second: how many of the
        machine's cores the measured work kept busy."""
        return sum(self.used.values()) / self.wall if self.wall else 0.0

    def per_item(self, items: int, names: Sequence[str]) -> str:
        """'python 0.41 postgres 0.22 ms' — CPU milliseconds per item of each component."""
        return " ".join(f"{name} {1000 * self.used.get(name, 0.0) / items:.2f}"
                        for name in names) + " ms"


class RssSampler:
    """Peak RSS (bytes) while the ``with`` block runs: of this process (``peak``) and of
    this process plus those of its live child processes whose command line contains
    *helper* — the S3 worker, not the servers the benchmark started — sampled together
    (``peak_with_children``)."""

    def __init__(self, every_s: float = 0.01, helper: str = "actors.s3.worker") -> None:
        self.every_s = every_s
        self.helper = helper
        self.peak = 0
        self.peak_with_children = 0
        self.start_rss = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def _run(self) -> None:
        proc = psutil.Process()
        while not self._stop.is_set():
            own = proc.memory_info().rss
            children = 0
            for child in proc.children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    if self.helper in " ".join(child.cmdline()):
                        children += child.memory_info().rss
            self.peak = max(self.peak, own)
            self.peak_with_children = max(self.peak_with_children, own + children)
            self._stop.wait(self.every_s)

    def __enter__(self) -> RssSampler:
        self.start_rss = psutil.Process().memory_info().rss
        self.peak = self.start_rss
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, psutil.Process().memory_info().rss)


def ru_maxrss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


class TimedDatabase:
    """Wraps a Database; ``stats[name]`` = [calls, wall, before fn, fn, after fn] (seconds)."""

    def __init__(self, db: Any) -> None:
        self._db = db
        self.stats: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0, 0.0, 0.0])

    async def atomic(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return await self._timed(self._db.atomic, fn, args, kwargs)

    async def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return await self._timed(self._db.run, fn, args, kwargs)

    async def atomic_each(self, fn: Callable[..., Any], items: Any) -> Any:
        """A group of one-statement units in one hop, timed as one call per group."""
        name = getattr(fn, "__name__", None) or getattr(getattr(fn, "func", None),
                                                         "__name__", "atomic_each")
        t0 = time.perf_counter()
        result = await self._db.atomic_each(fn, items)
        s = self.stats[f"{name} (group)"]
        s[0] += 1
        s[1] += time.perf_counter() - t0
        return result

    async def _timed(self, call: Callable[..., Any], fn: Callable[..., Any],
                     args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        marks: list[float] = []

        def timed(conn: Any, *a: Any, **k: Any) -> Any:
            marks.append(time.perf_counter())
            try:
                return fn(conn, *a, **k)
            finally:
                marks.append(time.perf_counter())

        t0 = time.perf_counter()
        result = await call(timed, *args, **kwargs)
        t1 = time.perf_counter()
        s = self.stats[fn.__name__]
        s[0] += 1
        s[1] += t1 - t0
        s[2] += marks[0] - t0
        s[3] += marks[1] - marks[0]
        s[4] += t1 - marks[1]
        return result

    def report(self, per: int, label: str) -> list[str]:
        lines = [f"  {'unit of work':22}{'calls':>7}{'wall s':>8}  {'per call ms':>11}"
                 f"  {'= before':>9}{'+ fn':>7}{'+ after':>8}   {'wall ms/' + label:>12}"]
        for name, (n, wall, pre, fn, post) in sorted(self.stats.items(),
                                                      key=lambda kv: -kv[1][1]):
            k = 1000 / n
            lines.append(f"  {name:22}{int(n):7d}{wall:8.2f}  {wall * k:11.3f}  {pre * k:9.3f}"
                         f"{fn * k:7.3f}{post * k:8.3f}   {1000 * wall / per:12.3f}")
        return lines


PY_SPY = Path(sys.executable).parent / "py-spy"


def py_spy_available() -> bool:
    return PY_SPY.exists() or shutil.which("py-spy") is not None


@contextlib.contextmanager
def py_spy(out: Path, rate: int = 400) -> Iterator[Path]:
    """Sample this process while the block runs (py-spy, raw stacks): at each sample, the
    stack of the thread that holds the GIL, if any (``--gil``).

    The GIL is what every thread here (Trio's, the database workers) queues for, so these
    samples are where the Python CPU goes; code that releases the GIL (libpq's network
    I/O, socket syscalls) is not in them. (py-spy's "active thread" heuristics count
    threads blocked in epoll/poll/locks here, with or without ``--nonblocking``.)"""
    exe = str(PY_SPY) if PY_SPY.exists() else shutil.which("py-spy") or "py-spy"
    proc = subprocess.Popen(
        [exe, "record", "--pid", str(os.getpid()), "--rate", str(rate), "--format", "raw",
         "--threads", "--gil", "--nonblocking", "--full-filenames", "--duration", "900",
         "-o", str(out)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(0.7)  # let it attach
    try:
        yield out
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        if not out.exists():
            raise RuntimeError(f"py-spy wrote nothing: {err.decode(errors='replace')[-500:]}")


_FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^()]*):(?P<line>\d+)\)$")


def _package(path: str) -> str:
    """The top-level package (or ``stdlib:<module>``) a source file belongs to."""
    parts = path.split("/")
    if "site-packages" in parts:
        return parts[parts.index("site-packages") + 1].removesuffix(".py")
    for ours in ("actors", "supervision", "bench"):
        if ours in parts:
            return ours
    for i, part in enumerate(parts[:-1]):
        if re.fullmatch(r"python3\.\d+", part):
            return "stdlib:" + parts[i + 1].removesuffix(".py")
    return parts[-1]


def py_spy_report(raw: Path, per: int, label: str, rate: int = 400,
                  inclusive: Sequence[str] = (), top: int = 12) -> list[str]:
    """Where the samples went: by thread, by package of the running frame, by function,
    and the inclusive share of the named functions (``name`` or ``Class.name``)."""
    threads: Counter[str] = Counter()
    packages: Counter[str] = Counter()
    leaves: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count_s = line.rpartition(" ")
        if not stack:
            continue
        count = int(count_s)
        frames = stack.split(";")
        thread = frames[0]
        threads["main (Trio)" if "MainThread" in thread else "worker threads"] += count
        parsed = [m for m in map(_FRAME.match, frames[1:]) if m]
        if not parsed:
            continue
        total += count
        leaf = parsed[-1]
        packages[_package(leaf["file"])] += count
        leaves[f"{_package(leaf['file'])}: {leaf['func']}"] += count
        seen = {m["func"].rpartition(".")[2] for m in parsed} | {m["func"] for m in parsed}
        for name in inclusive:
            if name in seen:
                incl[name] += count
    if not total:
        return ["  (no samples)"]
    ms = 1000 / rate / per
    lines = [f"  {total} samples at {rate}/s = {total * ms:.3f} ms with the GIL per {label};"
             " by thread: "
             + ", ".join(f"{k} {100 * v / total:.0f}%" for k, v in threads.most_common())]
    lines.append("  own time by package: " + ", ".join(
        f"{k} {100 * v / total:.0f}%" for k, v in packages.most_common(12)))
    lines.append(f"  {'own %':>6}{'ms/' + label:>9}  function")
    for name, v in leaves.most_common(top):
        lines.append(f"  {100 * v / total:6.1f}{v * ms:9.3f}  {name}")
    if incl:
        lines.append(f"  {'incl %':>6}{'ms/' + label:>9}  inclusive (with all it calls)")
        for name, v in incl.most_common():
            lines.append(f"  {100 * v / total:6.1f}{v * ms:9.3f}  {name}")
    return lines


def spread(values: Sequence[float], fmt: str = "{:.0f}") -> str:
    """'median 1234 (min 1200, max 1300)'."""
    med = statistics.median(values)
    return (f"median {fmt.format(med)} (min {fmt.format(min(values))},"
            f" max {fmt.format(max(values))})")


def percentile(values: Sequence[float], q: float) -> float:
    """The value at quantile *q* (nearest rank) of *values*."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]
