"""The recorder-stop fan-out's bound on trio's MockClock: once the inbox closes, the stops
get 1.5 x ``media.timeout`` in all, a stop that started at once ends with its own
outcome, and those still queued are abandoned.

The sender is the real :class:`~actors.reaper.recorder_signal.RecorderSignal`; its HTTP
client's transport never answers (a hung media stack), so every wait is a timer and the
clock jumps from one to the next: the bound is checked to the tick, whatever the
machine's load (the integration test used to time a whole reaper cycle against it).
"""

from __future__ import annotations

import math

import httpx
import pytest
import structlog
import trio
import trio.testing

from actors.reaper.messages import StopRecording
from actors.reaper.recorder_signal import RecorderSignal, run_recorder_signal
from supervision.config import MediaConfig

TIMEOUT = 0.3  # media.timeout
BASE_URL = "http://media.invalid"


async def _fan_out(hung: list[str], concurrency: int) -> tuple[float, dict[str, str],
                                                                list[str]]:
    """Stops of *hung* recordings sent to a media stack that never answers: how long the
    fan-out ran after its inbox closed, each recording's logged failure, and the ones the
    media stack received."""
    received: list[str] = []

    async def never_answers(request: httpx.Request) -> httpx.Response:
        received.append(request.url.path.split("/")[2])
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    media = MediaConfig(base_url=BASE_URL, timeout=TIMEOUT)
    send, inbox = trio.open_memory_channel[StopRecording](math.inf)
    async with httpx.AsyncClient(transport=httpx.MockTransport(never_answers)) as http:
        sender = RecorderSignal(media, http)
        for rid in hung:
            send.send_nowait(StopRecording(rid, "conference-1"))
        send.close()  # the cycle's rooms are all closed: the fan-out's bound starts now
        started = trio.current_time()
        with structlog.testing.capture_logs() as logs:
            await run_recorder_signal(sender, inbox, concurrency=concurrency)
        took = trio.current_time() - started
    failed = {e["recording_id"]: e["error"] for e in logs
              if e["event"] == "recorder_stop_failed"}
    return took, failed, received


async def test_one_at_a_time_the_stop_in_flight_times_out_and_the_queued_are_abandoned(
        autojump_clock: trio.testing.MockClock) -> None:
    """Three hung stops, one at a time: the first times out at 0.3 s, the second is cut
    off at 0.45 s (1.5 x the timeout), the third was never sent; waiting for all three
    would have taken 0.9 s."""
    took, failed, received = await _fan_out(["r1", "r2", "r3"], concurrency=1)
    assert took == pytest.approx(1.5 * TIMEOUT)
    assert failed == {"r1": "timeout", "r2": "abandoned", "r3": "abandoned"}
    assert received == ["r1", "r2"]


async def test_stops_that_start_at_once_each_end_with_their_own_timeout(
        autojump_clock: trio.testing.MockClock) -> None:
    """With room for every stop, each one started at once and ends with its own timeout
    at 0.3 s, inside the bound: none is abandoned."""
    took, failed, received = await _fan_out(["r1", "r2", "r3"], concurrency=8)
    assert took == pytest.approx(TIMEOUT)
    assert failed == {"r1": "timeout", "r2": "timeout", "r3": "timeout"}
    assert sorted(received) == ["r1", "r2", "r3"]
