"""trio-asyncio imports and bridges on an asyncio without the names Python 3.14 removed.

Each test runs a fresh interpreter (the names must be gone *before* trio_asyncio is first
imported); the prelude deletes them where this Python still has them, as 3.14 did.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from supervision.tree import compat

ROOT = Path(__file__).resolve().parents[3]

# asyncio as Python 3.14 ships it: BaseDefaultEventLoopPolicy renamed with a leading
# underscore, AbstractChildWatcher gone
AS_ON_314 = """
import asyncio, asyncio.events
if hasattr(asyncio.events, "BaseDefaultEventLoopPolicy"):
    asyncio.events._BaseDefaultEventLoopPolicy = asyncio.events.BaseDefaultEventLoopPolicy
    del asyncio.events.BaseDefaultEventLoopPolicy
if hasattr(asyncio, "AbstractChildWatcher"):
    del asyncio.AbstractChildWatcher
"""

BRIDGE = """
import asyncio, json, sys, trio
from supervision.tree.bridge import open_asyncio_bridge, run_asyncio, trio_asyncio

async def on_asyncio():
    async def double(x):
        await asyncio.sleep(0.01)
        return 2 * x
    doubled = await asyncio.gather(*(asyncio.create_task(double(i)) for i in range(3)))
    timed_out = False
    try:
        await asyncio.wait_for(asyncio.sleep(30), 0.05)
    except TimeoutError:
        timed_out = True
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", "print('from the child')", stdout=asyncio.subprocess.PIPE)
    out, _ = await child.communicate()
    return {"doubled": doubled, "timed_out": timed_out, "child": out.decode().strip(),
            "returncode": child.returncode, "has_task": asyncio.current_task() is not None}

async def main():
    async with open_asyncio_bridge():
        result = await run_asyncio(on_asyncio)
        with trio.move_on_after(0.05) as scope:
            await run_asyncio(asyncio.sleep, 30)
    result["cancelled"] = scope.cancelled_caught
    result["left_behind"] = [hasattr(asyncio.events, "BaseDefaultEventLoopPolicy"),
                             hasattr(asyncio, "AbstractChildWatcher")]
    result["watcher_base"] = trio_asyncio._loop.TrioChildWatcher.__mro__[1].__qualname__
    print(json.dumps(result))

trio.run(main)
"""


RUNNING_LOOP = """
import asyncio, asyncio.events, json, trio
asyncio_get_running = asyncio.events._get_running_loop  # before trio-asyncio replaces it
from supervision.tree import compat
from supervision.tree.bridge import open_asyncio_bridge, run_asyncio, trio_asyncio
# as import_trio_asyncio does on 3.14, whatever this Python is
compat._run_handles_under_their_loop(trio_asyncio._base.BaseTrioEventLoop, asyncio_get_running)

async def seen_from_asyncio():
    await asyncio.sleep(0)
    return asyncio_get_running() is asyncio.get_running_loop()

async def main():
    async with open_asyncio_bridge():
        inside = await run_asyncio(seen_from_asyncio)
        in_trio = asyncio_get_running()
    print(json.dumps({"inside": inside, "in_trio": repr(in_trio)}))

trio.run(main)
"""


def run_python(code: str, *options: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter of this Python, from the repository root."""
    return subprocess.run(
        [sys.executable, *options, "-c", textwrap.dedent(code)],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )


def test_trio_asyncio_alone_fails_to_import_without_the_removed_names() -> None:
    """Without the shim, trio_asyncio's import fails on a 3.14-shaped asyncio (issue #152)."""
    proc = run_python(AS_ON_314 + "import trio_asyncio\n")
    assert proc.returncode == 1
    assert "AttributeError" in proc.stderr
    assert "BaseDefaultEventLoopPolicy" in proc.stderr


def test_bridge_runs_asyncio_when_the_removed_names_stand_in() -> None:
    """Through the shim trio_asyncio imports and runs tasks, timeouts, a child and cancellation."""
    proc = run_python(AS_ON_314 + BRIDGE)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result == {
        "doubled": [0, 2, 4], "timed_out": True, "child": "from the child", "returncode": 0,
        "has_task": True, "cancelled": True, "left_behind": [False, False],
        "watcher_base": "_ChildWatcherStandIn",
    }


def test_asyncio_callbacks_run_with_their_trio_loop_as_the_running_loop() -> None:
    """The 3.14 patch sets the loop asyncio's C tasks check only while a callback runs."""
    proc = run_python(RUNNING_LOOP)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"inside": True, "in_trio": "None"}


def test_bridge_imports_with_deprecation_warnings_as_errors() -> None:
    """trio-asyncio's known deprecations (child watcher, default policy) never stop the import."""
    proc = run_python("import supervision.tree.bridge\n", "-W", "error::DeprecationWarning")
    assert proc.returncode == 0, proc.stderr


@pytest.mark.skipif(sys.version_info >= (3, 14), reason="3.14 removed the names: shim in use")
def test_nothing_stands_in_where_asyncio_still_has_the_names() -> None:
    """On 3.11-3.13 nothing is patched: trio-asyncio keeps asyncio's own classes."""
    from supervision.tree.bridge import trio_asyncio

    assert compat._stand_ins() == []
    assert not hasattr(asyncio.Handle._run, "_under_trio_loop")
    assert issubclass(trio_asyncio._loop.TrioChildWatcher, asyncio.AbstractChildWatcher)
