"""The asyncio bridge: one trio-asyncio loop for the whole process.

>>> async with open_asyncio_bridge():
...     await run_asyncio(producer.send_batch, messages)   # an asyncio coroutine, from Trio

aiokafka only speaks asyncio. The root opens one trio-asyncio loop around the whole actor
tree; actors call asyncio coroutine functions through :func:`run_asyncio`. Each crossing
costs a few hundred microseconds, so cross once per *batch*, never per message.

What cancellation does: cancelling the Trio caller cancels the asyncio task (it sees
``asyncio.CancelledError`` at its current await), and Trio waits for it to finish.

trio-asyncio is imported through :mod:`supervision.tree.compat`: its latest release does not
import on Python 3.14 by itself.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, ParamSpec, TypeVar

from supervision.tree.compat import import_trio_asyncio

trio_asyncio = import_trio_asyncio()

P = ParamSpec("P")
T = TypeVar("T")


@asynccontextmanager
async def open_asyncio_bridge() -> AsyncIterator[Any]:
    """Open the process's asyncio loop (inside Trio) for the duration of the block."""
    async with trio_asyncio.open_loop() as loop:
        yield loop


async def run_asyncio(fn: Callable[P, Awaitable[T]], *args: P.args, **kwargs: P.kwargs) -> T:
    """Await the asyncio coroutine ``fn(*args, **kwargs)`` from Trio."""
    result: T = await trio_asyncio.aio_as_trio(fn)(*args, **kwargs)
    return result
