"""The HTTP endpoint against hostile clients (issue #26): idle and slow connections, a
huge request, a flood of connections; the prober is still answered, the log stays short,
and /readyz's body is bounded and names no address."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from structlog.testing import capture_logs

from actors.metrics_exporter import HEAD_DEADLINE, Readiness, serve_metrics_exporter
from supervision.tree.health import HEALTH

ROOT = Path(__file__).resolve().parents[3]
# an observation window, not a wait for a state: a bound on what the server logs after the
# clients leave can only be checked over some time
AFTERMATH_S = 0.5
EXPORTER = textwrap.dedent("""
    import resource, sys, trio
    resource.setrlimit(resource.RLIMIT_NOFILE, (128, 128))
    from actors.metrics_exporter import Readiness, serve_metrics_exporter
    from supervision.logs import configure_logging
    configure_logging("info", "json")

    async def ping():
        return None

    trio.run(serve_metrics_exporter, sys.argv[1], Readiness(ping))
""")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def exporter_with_128_fds() -> Iterator[tuple[int, subprocess.Popen[str]]]:
    """The exporter alone in a process limited to 128 file descriptors."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", EXPORTER, f"127.0.0.1:{port}"], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)},
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
    yield port, proc
    proc.kill()
    proc.wait()


def test_200_idle_connections_do_not_keep_readyz_from_answering(
        exporter_with_128_fds: tuple[int, subprocess.Popen[str]]) -> None:
    """With 128 descriptors and 200 connections that never send a byte, /readyz answers
    200 at once, and the exporter logs a bounded number of lines (no traceback)."""
    port, proc = exporter_with_128_fds
    idle = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(200)]
    try:
        started = time.monotonic()
        answer = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5)
        assert (answer.status_code, answer.text) == (200, "ready\n")
        assert time.monotonic() - started < 2.0
    finally:
        for conn in idle:
            conn.close()
    time.sleep(AFTERMATH_S)  # what the closed connections make it log
    proc.send_signal(signal.SIGKILL)
    _, stderr = proc.communicate(timeout=30)
    lines = [line for line in stderr.splitlines() if line.startswith("{")]
    events = [json.loads(line)["event"] for line in lines]
    assert "Traceback" not in stderr
    assert len([e for e in events if e != "http_listening"]) <= 3, events


async def _open(port: int) -> trio.SocketStream:
    return await trio.open_tcp_stream("127.0.0.1", port)


async def _closed_within(stream: trio.SocketStream, seconds: float) -> bool:
    """True when the server closes (or resets) *stream* within *seconds*."""
    with trio.move_on_after(seconds):
        try:
            while await stream.receive_some(65536):
                pass
        except trio.BrokenResourceError:
            pass
        return True
    return False


async def test_a_slowloris_is_closed_after_the_head_deadline() -> None:
    """A client sending its request a byte every 0.3 s is closed about HEAD_DEADLINE after
    it connected, without an answer."""
    async def ping() -> None:
        return None

    async with trio.open_nursery() as nursery:
        (listener, *_) = await nursery.start(serve_metrics_exporter, "127.0.0.1:0",
                                             Readiness(ping))
        port = listener.socket.getsockname()[1]
        stream = await _open(port)
        started = trio.current_time()

        async def dribble() -> None:
            with trio.move_on_after(10):
                for byte in b"GET /metrics HTTP/1.1\r\nhost: x\r\n":
                    await stream.send_all(bytes([byte]))
                    await trio.sleep(0.3)

        nursery.start_soon(dribble)
        assert await _closed_within(stream, HEAD_DEADLINE + 3)
        assert trio.current_time() - started < HEAD_DEADLINE + 1
        nursery.cancel_scope.cancel()


async def test_a_request_past_the_size_bound_is_closed_unanswered() -> None:
    """A 100 KB header line gets no answer: the connection is closed."""
    async def ping() -> None:
        return None

    async with trio.open_nursery() as nursery:
        (listener, *_) = await nursery.start(serve_metrics_exporter, "127.0.0.1:0",
                                             Readiness(ping))
        stream = await _open(listener.socket.getsockname()[1])
        with trio.move_on_after(5):  # the server may close before all of it is sent
            with contextlib.suppress(trio.BrokenResourceError):
                await stream.send_all(b"GET /metrics HTTP/1.1\r\nx-pad: " + b"a" * 100_000)
        assert await _closed_within(stream, 5)
        nursery.cancel_scope.cancel()


async def test_connections_past_the_cap_while_all_answer_are_refused_with_one_line() -> None:
    """Two slots, both answering a /readyz that waits on the database: twenty more
    connections are closed at once, and the log has one refusal line counting the rest."""
    release = trio.Event()
    answering: list[None] = []
    both_answering = trio.Event()

    async def slow_ping() -> None:
        answering.append(None)
        if len(answering) == 2:
            both_answering.set()
        await release.wait()

    with capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            (listener, *_) = await nursery.start(partial_exporter(2), "127.0.0.1:0",
                                                 Readiness(slow_ping, cache_s=0))
            port = listener.socket.getsockname()[1]
            busy = [await _open(port) for _ in range(2)]
            for stream in busy:
                await stream.send_all(b"GET /readyz HTTP/1.1\r\nhost: x\r\n\r\n")
            with trio.fail_after(5):  # both requests read: their slots are answering
                await both_answering.wait()
            for _ in range(20):
                extra = await _open(port)
                assert await _closed_within(extra, 2)
            release.set()
            for stream in busy:
                assert b"200" in await stream.receive_some(4096)
            nursery.cancel_scope.cancel()
    refused = [e for e in logs if e["event"] == "http_connection_refused"]
    assert len(refused) == 1 and refused[0]["suppressed"] == 0


def partial_exporter(limit: int) -> Any:
    return partial(serve_metrics_exporter, max_connections=limit)


async def test_readyz_body_is_bounded_and_names_no_address() -> None:
    """Thirty faulted topics and a broker address in the reason: /readyz names the first
    fault without the address and counts the others."""
    async def ping() -> None:
        return None

    HEALTH.set_fault("kafka", "; ".join(f"topic t{n}: UnknownTopicOrPartition"
                                        for n in range(30)))
    HEALTH.set_fault("media", "connection refused by media-7.internal:8443")
    try:
        async with trio.open_nursery() as nursery:
            (listener, *_) = await nursery.start(serve_metrics_exporter, "127.0.0.1:0",
                                                 Readiness(ping))
            port = listener.socket.getsockname()[1]
            async with httpx.AsyncClient() as http:
                answer = await http.get(f"http://127.0.0.1:{port}/readyz", timeout=5)
            nursery.cancel_scope.cancel()
    finally:
        HEALTH.clear_fault("kafka")
        HEALTH.clear_fault("media")
    assert answer.status_code == 503
    assert answer.text == ("not ready: configuration fault in kafka: topic t0: "
                           "UnknownTopicOrPartition (and 30 more; see the log)\n")
    HEALTH.set_fault("media", "connection refused by media-7.internal:8443")
    try:
        assert HEALTH.summary() == "configuration fault in media: connection refused by <host>"
    finally:
        HEALTH.clear_fault("media")
