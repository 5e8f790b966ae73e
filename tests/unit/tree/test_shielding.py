"""The finish-or-abort primitive and the periodic ticker (fake clock)."""

from __future__ import annotations

import pytest
import trio
import trio.lowlevel

from supervision.tree.shielding import StopGuard, WorkAbandoned, guarded_by, must_complete
from supervision.tree.ticker import Ticker


async def test_must_complete_block_survives_a_soft_cancel(autojump_clock: object) -> None:
    """The outer cancel waits for the block and lands right after it."""
    steps: list[str] = []
    with trio.move_on_after(1):
        async with must_complete():
            await trio.sleep(5)
            steps.append("done")
        steps.append("after")
        await trio.lowlevel.checkpoint()
        steps.append("unreachable")
    assert steps == ["done", "after"]
    assert trio.current_time() == pytest.approx(5)


async def test_hard_stop_aborts_the_block_with_work_abandoned(autojump_clock: object) -> None:
    """With no outer cancel, a hard stop surfaces as WorkAbandoned."""
    guard = StopGuard()
    aborted: list[str] = []
    with guarded_by(guard):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_hard_stop_after, guard, 2.0)
            with guard.on_hard_stop(lambda: aborted.append("cancel request")), \
                    pytest.raises(WorkAbandoned):
                async with must_complete():
                    await trio.sleep(100)
    assert aborted == ["cancel request"]
    assert trio.current_time() == pytest.approx(2)


async def _hard_stop_after(guard: StopGuard, delay: float) -> None:
    await trio.sleep(delay)
    guard.hard_stop()


async def test_hard_stop_reaches_nested_guards_and_later_blocks(autojump_clock: object) -> None:
    """A parent's hard stop aborts children's blocks, including blocks started afterwards."""
    parent = StopGuard()
    child = parent.child()
    parent.hard_stop()
    with guarded_by(child), pytest.raises(WorkAbandoned):
        async with must_complete():
            await trio.sleep(100)
    assert child.stopped


async def test_must_complete_timeout_raises_too_slow(autojump_clock: object) -> None:
    """A block bounded on its own reports that it ran out of time."""
    with pytest.raises(trio.TooSlowError):
        async with must_complete(limit=3):
            await trio.sleep(10)
    assert trio.current_time() == pytest.approx(3)


async def test_ticker_first_tick_is_soon_then_fixed_interval(autojump_clock: object) -> None:
    """Ticks come at first_delay, then every interval."""
    ticker = Ticker(interval=10, first_delay=0.5)
    times = []
    for _ in range(3):
        await ticker.wait()
        times.append(trio.current_time())
    assert times == pytest.approx([0.5, 10.5, 20.5])


async def test_ticker_coalesces_ticks_missed_by_a_long_cycle(autojump_clock: object) -> None:
    """A cycle that overruns 2.5 intervals gets one immediate tick, then the schedule."""
    ticker = Ticker(interval=10)
    await ticker.wait()                  # t=0
    await trio.sleep(25)                 # the cycle overruns ticks at 10 and 20
    await ticker.wait()
    assert trio.current_time() == pytest.approx(25)   # one coalesced tick, no pile-up
    await ticker.wait()
    assert trio.current_time() == pytest.approx(30)   # back on the fixed schedule
    assert ticker.missed == 1


async def test_ticker_never_starts_a_tick_during_a_running_cycle(autojump_clock: object) -> None:
    """The next tick is only asked for after the cycle returns, so cycles never overlap."""
    ticker = Ticker(interval=1)
    running = False
    overlaps = 0
    for _ in range(5):
        await ticker.wait()
        overlaps += running
        running = True
        await trio.sleep(2.5)
        running = False
    assert overlaps == 0
