"""The trio-asyncio bridge runs asyncio code under Trio and carries cancellation across."""

from __future__ import annotations

import asyncio

import trio

from supervision.tree.bridge import open_asyncio_bridge, run_asyncio


async def test_asyncio_coroutine_runs_under_trio() -> None:
    """An asyncio coroutine returns its value through the bridge."""

    async def add(a: int, b: int) -> int:
        await asyncio.sleep(0.01)
        return a + b

    async with open_asyncio_bridge():
        assert await run_asyncio(add, 2, 3) == 5


async def test_trio_cancellation_cancels_the_asyncio_task() -> None:
    """A Trio timeout reaches the asyncio side as CancelledError, and Trio waits for it."""
    seen: list[str] = []

    async def slow() -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    async with open_asyncio_bridge():
        with trio.move_on_after(0.1) as scope:
            await run_asyncio(slow)
    assert scope.cancelled_caught
    assert seen == ["cancelled"]


async def test_asyncio_exceptions_propagate_to_trio() -> None:
    """An exception raised on the asyncio side is raised to the Trio caller unchanged."""

    async def fail() -> None:
        await asyncio.sleep(0)
        raise KeyError("from asyncio")

    async with open_asyncio_bridge():
        try:
            await run_asyncio(fail)
        except KeyError as exc:
            assert exc.args == ("from asyncio",)
        else:
            raise AssertionError("the KeyError was lost on the bridge")
