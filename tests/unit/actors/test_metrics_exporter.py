"""The /metrics, /healthz and /readyz endpoint against clients that misbehave."""

from __future__ import annotations

import socket
import struct

import httpx
import trio

from actors.metrics_exporter import Readiness, serve_metrics_exporter


async def test_scraper_hanging_up_before_the_answer_does_not_stop_the_exporter() -> None:
    """A client gives up on /readyz while the database check is still running (a scraper
    timeout during a PostgreSQL outage) and resets its connection: the answer it no
    longer reads is dropped, and the exporter goes on serving the next request."""
    asked, release = trio.Event(), trio.Event()

    async def slow_ping() -> None:
        asked.set()
        await release.wait()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(serve_metrics_exporter, "127.0.0.1:0",
                                        Readiness(slow_ping, cache_s=0))
        port = listeners[0].socket.getsockname()[1]
        client = trio.socket.socket()
        await client.connect(("127.0.0.1", port))
        await client.send(b"GET /readyz HTTP/1.1\r\nhost: x\r\n\r\n")
        await asked.wait()
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        client.close()  # linger 0: a reset, as a client's timeout does
        release.set()
        async with httpx.AsyncClient() as http:
            answer = await http.get(f"http://127.0.0.1:{port}/healthz", timeout=5)
        assert answer.status_code == 200
        nursery.cancel_scope.cancel()
