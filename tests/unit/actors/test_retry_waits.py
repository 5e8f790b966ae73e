"""The retry loops wait by the one full-jitter policy (fake clock, no servers)."""

from __future__ import annotations

import itertools
from typing import Any

import psycopg
import pytest
import trio

from actors.leases import lock_keeper, scan_leader
from actors.leases.lock_keeper import CycleContext, CycleOutcome, CycleStatus, LockedJob
from actors.outbox import listener
from actors.s3 import credentials
from actors.s3.credentials import CredentialSource, CredentialsUnavailable
from supervision.config import S3Config
from supervision.tree.wakeup import Wakeup


async def no_cycle(ctx: CycleContext) -> None:
    raise AssertionError("no cycle runs without a connection")


def check_jittered(waits: list[float], ceilings: list[float]) -> None:
    """Each wait inside its window; the waits at the cap are not one repeated value and
    average about half the cap (full jitter, not a fixed exponential)."""
    for wait, ceiling in zip(waits, ceilings, strict=True):
        assert -1e-6 <= wait <= ceiling + 1e-6, (wait, ceiling)
    cap = ceilings[-1]
    capped = [w for w, c in zip(waits, ceilings, strict=True) if c == cap]
    assert len(capped) >= 20
    assert len({round(w, 6) for w in capped}) > len(capped) // 2, capped
    assert 0.25 * cap < sum(capped) / len(capped) < 0.75 * cap


async def test_lock_keeper_reconnects_wait_a_jittered_growing_window(
        autojump_clock: object, monkeypatch: pytest.MonkeyPatch) -> None:
    """A keeper that cannot reach the database waits a draw from
    [0, min(reconnect_cap, reconnect_base x 2^(n-1))] after its n-th failed tick."""
    times: list[float] = []

    async def unreachable(job: Any, lock: Any, *, probe: bool = True) -> CycleOutcome[Any]:
        times.append(trio.current_time())
        lock.failures += 1
        return CycleOutcome(CycleStatus.NO_CONNECTION, error="refused")

    monkeypatch.setattr(lock_keeper, "run_locked_cycle", unreachable)
    job = LockedJob("test-jitter", interval=0.001, lock_ttl=5, cycle=no_cycle,
                    first_delay=0, reconnect_base=0.5, reconnect_cap=4.0)
    with trio.move_on_after(200):
        await lock_keeper.serve_lock_keeper(job, "postgresql://unused")
    # a tick follows the back-off by at most one interval
    waits = [b - a - job.interval for a, b in itertools.pairwise(times)]
    waits = [max(0.0, w) for w in waits]
    ceilings = [job.reconnect.ceiling(n) for n in range(len(waits))]
    assert ceilings[:4] == [0.5, 1.0, 2.0, 4.0]
    check_jittered(waits, ceilings)


async def test_scan_leader_reconnects_wait_a_jittered_growing_window(
        autojump_clock: object, monkeypatch: pytest.MonkeyPatch) -> None:
    """A standby that cannot read the lease backs off by the same policy as a job's
    keeper: its n-th consecutive failure waits a draw from the n-th window."""
    times: list[float] = []

    class Unreachable:
        def __init__(self, dsn: str, deadline: float | None = None) -> None:
            pass

        async def acquire(self, lease: Any) -> None:
            times.append(trio.current_time())
            raise psycopg.OperationalError("connection refused")

        def discard(self) -> None:
            pass

    async def never(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        raise AssertionError("no scans without the lease")

    monkeypatch.setattr(scan_leader, "LockConnection", Unreachable)
    lease = LockedJob("test-scan-jitter", interval=5.0, lock_ttl=30, cycle=no_cycle,
                      reconnect_base=0.5, reconnect_cap=4.0)
    with trio.move_on_after(200):
        await scan_leader.serve_scan_leader(lease, "postgresql://unused", never)
    waits = [b - a for a, b in itertools.pairwise(times)]
    check_jittered(waits, [lease.reconnect.ceiling(n) for n in range(len(waits))])


async def test_outbox_listener_reconnects_wait_a_jittered_growing_window(
        autojump_clock: object, monkeypatch: pytest.MonkeyPatch) -> None:
    """A listener whose server is gone retries after a draw from
    [0, min(15 s, 0.5 s x 2^n)] after its n-th consecutive failure, never a fixed step."""
    times: list[float] = []

    def refused(*args: Any, **kwargs: Any) -> psycopg.Connection:
        times.append(trio.current_time())
        raise psycopg.OperationalError("connection refused")

    async def in_loop(fn: Any, *args: Any, **kwargs: Any) -> Any:
        # the fake clock would jump past a worker thread's call: run it in the loop
        await trio.lowlevel.checkpoint()
        return fn(*args)

    monkeypatch.setattr(listener, "connect", refused)
    monkeypatch.setattr(trio.to_thread, "run_sync", in_loop)
    with trio.move_on_after(1_000):
        await listener.serve_outbox_listener("postgresql://unused", Wakeup())
    waits = [b - a for a, b in itertools.pairwise(times)]
    ceilings = [listener.RECONNECT.ceiling(n) for n in range(1, len(waits) + 1)]
    assert ceilings[:3] == [1.0, 2.0, 4.0] and ceilings[-1] == 15.0
    check_jittered(waits, ceilings)


def test_s3_credential_resolution_retries_wait_a_jittered_growing_window() -> None:
    """A credential chain that keeps failing is asked again after a draw from
    [0, min(60 s, 1 s x 2^(n-1))] after its n-th failure (seen on a fake clock stepped by
    20 ms), not on a fixed schedule shared by every replica."""
    now = [0.0]
    asked: list[float] = []

    def failing(_cfg: S3Config) -> Any:
        asked.append(now[0])
        raise RuntimeError("Credentials were refreshed, but the refreshed credentials are "
                           "still expired.")

    source = CredentialSource(S3Config(), resolver=failing, clock=lambda: now[0])
    step = 0.02
    while len(asked) < 30:
        with pytest.raises(CredentialsUnavailable):
            source.current()
        now[0] += step
    waits = [b - a for a, b in itertools.pairwise(asked)]
    ceilings = [credentials.BACKOFF.ceiling(n) + step for n in range(len(waits))]
    assert ceilings[0] == pytest.approx(1.0 + step) and ceilings[-1] == 60.0 + step
    for wait, ceiling in zip(waits, ceilings, strict=True):
        assert 0.0 < wait <= ceiling + 1e-9
    capped = waits[6:]  # windows of 60 s
    assert len({round(w, 6) for w in capped}) > len(capped) // 2, capped
    assert 15.0 < sum(capped) / len(capped) < 45.0
