"""Every benchmark still imports: bench/ is not run by the suite, so a moved name in the
code it drives (as `POOL_SIZE` moving to supervision.app.resources once did) would
otherwise be found only by the next person to run it."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

BENCHES = sorted(p.stem for p in (Path(__file__).resolve().parents[3] / "bench").glob("*.py"))


def test_the_benchmarks_are_found() -> None:
    assert {"cpu_per_row", "outbox_relay", "scale", "latency_drain"} <= set(BENCHES)


@pytest.mark.parametrize("name", BENCHES)
def test_benchmark_imports(name: str) -> None:
    module = importlib.import_module(f"bench.{name}")
    assert module.__doc__, f"bench/{name}.py says what it measures and how to run it"
