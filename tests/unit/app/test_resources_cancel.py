"""The resource set under a cancellation at any moment of its start-up: every resource it
opened is closed, once, in reverse order, and leaving the set never hangs.

The holders wait for their release in a shield (work still unwinding keeps its pool,
tests/integration/app/test_resources.py). When a cancellation reaches ``nursery.start``
while a holder is still opening (an opening trio cannot interrupt, such as the S3
worker's spawn in a thread), trio does not hand that holder to the set's nursery: the
start waits for it to end. A holder that then waited in its shield for a release that
only comes after the start hung the daemon's exit (a full test run stopped in
``test_cancelled_cycle_leaves_every_recording_whole_or_untouched``). Each scenario runs
in a thread of its own with a watchdog, because a hang behind a shield ignores every
deadline.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import attrs
import pytest
import trio

from supervision.app import resources as resources_module
from supervision.app.resources import Resource, ResourceSet, open_resource_set
from supervision.app.settings import Config
from tests.conftest import make_config

OPEN_S = 0.01  # how long each fake resource takes to open
WATCHDOG_S = 10.0  # a scenario that has not ended by then hangs
# every moment of the start-up: before, during and after each of the five openings
DEADLINES = [round(OPEN_S * step / 2, 4) for step in range(0, 2 * len(Resource) + 3)]


@asynccontextmanager
async def _no_bridge() -> AsyncIterator[None]:
    yield None


def _run_with_watchdog(scenario: Any) -> None:
    failure: list[BaseException] = []

    def target() -> None:
        try:
            trio.run(scenario)
        except BaseException as exc:  # reported by the test's own thread
            failure.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(WATCHDOG_S)
    assert not thread.is_alive(), "leaving the resource set hung"
    if failure:
        raise failure[0]


@attrs.define
class _FakeResources:
    """The set's openings replaced: each takes OPEN_S and cannot be interrupted (as the S3
    worker's spawn in a thread: the holder goes on to start once it is done, cancelled or
    not); what opened and what closed, in order."""

    opened: list[Resource] = attrs.field(factory=list)
    closed: list[Resource] = attrs.field(factory=list)

    async def open(self, _set: ResourceSet, resource: Resource, _cfg: Config,
                   stack: AsyncExitStack) -> None:
        with trio.CancelScope(shield=True):
            await trio.sleep(OPEN_S)
        self.opened.append(resource)
        stack.callback(self.closed.append, resource)


@pytest.fixture
def fake() -> Iterator[_FakeResources]:
    fake = _FakeResources()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ResourceSet, "_open", lambda *args: fake.open(*args))
        patch.setattr(resources_module, "open_asyncio_bridge", _no_bridge)
        yield fake


CFG = make_config("postgresql://safetynet@127.0.0.1:9/none")


@pytest.mark.parametrize("deadline", DEADLINES)
def test_a_cancelled_start_up_closes_every_opened_resource_and_never_hangs(
        deadline: float, fake: _FakeResources) -> None:
    """Cancelled at *deadline* into its start-up, the set closes what it opened, in
    reverse order, and its exit returns."""

    async def scenario() -> None:
        with trio.move_on_after(deadline):
            async with open_resource_set(CFG):
                await trio.sleep_forever()

    _run_with_watchdog(scenario)
    assert fake.closed == list(reversed(fake.opened))


def test_a_start_up_left_uncancelled_opens_every_resource(fake: _FakeResources) -> None:
    """The control: given time, the set opens all five resources and closes them on exit."""

    async def scenario() -> None:
        async with open_resource_set(CFG):
            pass

    _run_with_watchdog(scenario)
    assert fake.opened == list(Resource)
    assert fake.closed == list(reversed(Resource))
