"""Measurement helpers shared by the benchmarks (not a benchmark itself).

* :class:`CpuMeter` — CPU seconds spent by this process, by server process trees (a
  postmaster and its backends, a weed, a broker) and by reaped children (pgbench) between
  two points, so a run can say where the machine's cores went;
* :class:`RssSampler` — the peak resident set size of this process while a block runs
  (psutil every 10 ms, plus ``ru_maxrss`` for the lifetime peak);
* :class:`TimedDatabase` — a stand-in for :class:`supervision.database.Database` that
  times every unit of work on both sides of the thread crossing: before the function runs
  in its worker thread (dispatch + pool checkout with its check query + BEGIN), the function
  itself (its statements), and after it (COMMIT + check-in + the way back into Trio);
* :func:`yappi_report` — a CPU profile of every thread (yappi, optional) as a short table.
"""

from __future__ import annotations

import contextlib
import resource
import statistics
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import psutil


def _tree_cpu(pid: int) -> float:
    """User + system seconds of *pid*, its reaped children and its live descendants."""
    try:
        proc = psutil.Process(pid)
        t = proc.cpu_times()
        total = t.user + t.system + t.children_user + t.children_system
        for child in proc.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                ct = child.cpu_times()
                total += ct.user + ct.system
        return float(total)
    except psutil.Error:
        return 0.0


def _self_cpu() -> float:
    t = psutil.Process().cpu_times()
    return float(t.user + t.system)


def _reaped_children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return float(ru.ru_utime + ru.ru_stime)


class CpuMeter:
    """CPU seconds per component between :meth:`start` and :meth:`stop` (plus wall time)."""

    def __init__(self, servers: dict[str, int | None]) -> None:
        self.servers = {name: pid for name, pid in servers.items() if pid}
        self._t0: dict[str, float] = {}
        self.used: dict[str, float] = {}
        self.wall = 0.0

    def _snapshot(self) -> dict[str, float]:
        snap = {"python": _self_cpu(), "children": _reaped_children_cpu()}
        snap.update({name: _tree_cpu(pid) for name, pid in self.servers.items()})
        snap["wall"] = time.perf_counter()
        return snap

    def start(self) -> None:
        self._t0 = self._snapshot()

    def stop(self) -> None:
        t1 = self._snapshot()
        self.wall = t1.pop("wall") - self._t0["wall"]
        self.used = {name: t1[name] - self._t0[name] for name in t1}

    @contextlib.contextmanager
    def measure(self) -> Iterator[CpuMeter]:
        self.start()
        try:
            yield self
        finally:
            self.stop()

    def per_item(self, items: int, names: Sequence[str]) -> str:
        """'python 0.41 postgres 0.22 ms' — CPU milliseconds per item of each component."""
        return " ".join(f"{name} {1000 * self.used.get(name, 0.0) / items:.2f}"
                        for name in names) + " ms"


class RssSampler:
    """Peak RSS (bytes) of this process while the ``with`` block runs."""

    def __init__(self, every_s: float = 0.01) -> None:
        self.every_s = every_s
        self.peak = 0
        self.start_rss = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def _run(self) -> None:
        proc = psutil.Process()
        while not self._stop.is_set():
            self.peak = max(self.peak, proc.memory_info().rss)
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


def yappi_available() -> bool:
    try:
        import yappi  # noqa: F401
    except ImportError:
        return False
    return True


@contextlib.contextmanager
def yappi_profile() -> Iterator[dict[str, Any]]:
    """CPU-clock profile of every thread while the block runs; the dict gets the stats."""
    import yappi

    out: dict[str, Any] = {}
    yappi.clear_stats()
    yappi.set_clock_type("cpu")
    yappi.start(builtins=False, profile_threads=True)
    try:
        yield out
    finally:
        yappi.stop()
        out["funcs"] = yappi.get_func_stats()
        out["threads"] = yappi.get_thread_stats()


def _short(module: str, name: str, lineno: int) -> str:
    parts = module.replace("\\", "/").split("/")
    if "site-packages" in parts:
        parts = parts[parts.index("site-packages") + 1:]
    elif len(parts) > 2:
        parts = parts[-2:]
    return f"{'/'.join(parts)}:{lineno} {name}"


def yappi_report(prof: dict[str, Any], per: int, label: str, top: int = 18,
                 inclusive: Sequence[str] = ()) -> list[str]:
    """Top functions by own CPU time, plus the inclusive time of the named functions."""
    funcs = list(prof["funcs"])
    total = sum(f.tsub for f in funcs) or 1.0
    lines = [f"  CPU profiled (all threads): {total:.2f} s = {1000 * total / per:.3f} ms/{label}"]
    threads = sorted(prof["threads"], key=lambda t: -t.ttot)
    lines.append("  by thread: " + ", ".join(
        f"{t.name}#{t.id} {t.ttot:.2f}s" for t in threads[:6] if t.ttot > 0.01))
    lines.append(f"  {'own %':>6}{'own s':>7}{'incl s':>8}{'calls':>9}  function")
    for f in sorted(funcs, key=lambda f: -f.tsub)[:top]:
        lines.append(f"  {100 * f.tsub / total:6.1f}{f.tsub:7.2f}{f.ttot:8.2f}{f.ncall:9d}"
                     f"  {_short(f.module, f.name, f.lineno)}")
    wanted = [f for f in funcs if f.name in inclusive]
    if wanted:
        lines.append("  inclusive CPU of selected functions (share of all profiled CPU):")
        for f in sorted(wanted, key=lambda f: -f.ttot):
            lines.append(f"  {100 * f.ttot / total:6.1f}%{f.ttot:7.2f}s{f.ncall:9d}  "
                         f"{_short(f.module, f.name, f.lineno)}")
    return lines


def spread(values: Sequence[float], fmt: str = "{:.0f}") -> str:
    """'median 1234 (min 1200, max 1300)'."""
    med = statistics.median(values)
    return (f"median {fmt.format(med)} (min {fmt.format(min(values))},"
            f" max {fmt.format(max(values))})")
