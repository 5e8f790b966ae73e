"""A real HTTP server on loopback standing in for the media stack's recorder API (SPEC §5).

>>> with serve_media_stub() as media:
...     media.answer(recording_id, 500)        # or media.hang / media.garbage(recording_id)
...     ...                                    # POST {media.base_url}/recordings/{id}/stop
...     media.requests                         # what it received, in order

HTTP/1.1 with keep-alive over TCP (or TLS, given a server context), served by
``trio.serve_tcp`` and h11 on an event loop of its own (a background thread, or the main
thread with ``python -m tests.media_stub``), so the client under test goes through a real
socket and a real HTTP parser. It records every
request (method, path, headers, JSON body) before answering, so a test that waited for
the sender to finish sees every request that reached the server. Stops answer 200 unless
told otherwise; a hung request is held until the stub stops.
"""

from __future__ import annotations

import contextlib
import json
import ssl
import sys
import threading
from collections.abc import Iterator
from functools import partial
from typing import Any

import attrs
import h11
import pytest
import trio

__all__ = ["MediaStub", "StubRequest", "media_stub", "serve_media_stub"]


@attrs.frozen
class StubRequest:
    method: str
    path: str
    headers: dict[str, str]  # lower-cased names
    body: Any

    @property
    def recording_id(self) -> str | None:
        parts = self.path.strip("/").split("/")
        if len(parts) == 3 and parts[0] == "recordings" and parts[2] == "stop":
            return parts[1]
        return None


class MediaStub:
    """What the stand-in received and how it answers; safe to use from any thread."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.tls = tls  # a server context: HTTPS instead of HTTP
        self._lock = threading.Lock()
        self._requests: list[StubRequest] = []
        self._answers: dict[str, int] = {}
        self._hanging: set[str] = set()
        self._garbage: set[str] = set()
        self.port = 0
        self.stopped = trio.Event()  # set on the stub's own loop when it stops

    @property
    def base_url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    @property
    def requests(self) -> list[StubRequest]:
        with self._lock:
            return list(self._requests)

    def stops_for(self, recording_id: str) -> list[StubRequest]:
        return [r for r in self.requests if r.recording_id == recording_id]

    def answer(self, recording_id: str, status: int) -> None:
        """Answer stops of *recording_id* with *status*."""
        with self._lock:
            self._answers[recording_id] = status

    def hang(self, recording_id: str) -> None:
        """Never answer stops of *recording_id* (until the stub stops)."""
        with self._lock:
            self._hanging.add(recording_id)

    def garbage(self, recording_id: str) -> None:
        """Answer stops of *recording_id* with bytes that are not HTTP, then close."""
        with self._lock:
            self._garbage.add(recording_id)

    def _record(self, request: StubRequest) -> tuple[int, bool, bool]:
        with self._lock:
            self._requests.append(request)
            rid = request.recording_id or ""
            return self._answers.get(rid, 200), rid in self._hanging, rid in self._garbage

    async def _serve_connection(self, stream: trio.abc.Stream) -> None:
        conn = h11.Connection(h11.SERVER)
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError,
                                 h11.RemoteProtocolError):
            async with stream:
                head: h11.Request | None = None
                body = b""
                while True:
                    event = conn.next_event()
                    if event is h11.NEED_DATA:
                        conn.receive_data(await stream.receive_some(65536))
                    elif isinstance(event, h11.Request):
                        head, body = event, b""
                    elif isinstance(event, h11.Data):
                        body += bytes(event.data)
                    elif isinstance(event, h11.EndOfMessage) and head is not None:
                        await self._respond(stream, conn, head, body)
                        if conn.our_state is not h11.DONE:
                            return
                        conn.start_next_cycle()
                    else:  # ConnectionClosed, PAUSED
                        return

    async def _respond(self, stream: trio.abc.Stream, conn: h11.Connection,
                       head: h11.Request, raw: bytes) -> None:
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode(errors="replace")
        request = StubRequest(
            head.method.decode(), head.target.decode(),
            {k.decode().lower(): v.decode() for k, v in head.headers}, body)
        status, hang, garbage = self._record(request)
        if hang:
            await self.stopped.wait()
            return
        if garbage:  # the connection is closed after this (h11's state is not DONE)
            await stream.send_all(b"\x00\x01 SPAM SPAM\r\n\r\n")
            return
        payload = b"{}"
        await stream.send_all(
            conn.send(h11.Response(status_code=status, headers=[
                ("Content-Type", "application/json"),
                ("Content-Length", str(len(payload)))]))
            + (conn.send(h11.Data(data=payload)) or b"")
            + (conn.send(h11.EndOfMessage()) or b""))

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                    ) -> None:
        """Serve on a free loopback port until cancelled."""
        try:
            async with trio.open_nursery() as nursery:
                if self.tls is None:
                    listeners = await nursery.start(partial(
                        trio.serve_tcp, self._serve_connection, 0, host="127.0.0.1",
                        backlog=128))
                    self.port = listeners[0].socket.getsockname()[1]
                else:  # a failed handshake ends in BrokenResourceError, suppressed per stream
                    listeners = await nursery.start(partial(
                        trio.serve_ssl_over_tcp, self._serve_connection, 0, self.tls,
                        host="127.0.0.1", backlog=128))
                    self.port = listeners[0].transport_listener.socket.getsockname()[1]
                task_status.started()
        finally:
            self.stopped.set()


@contextlib.contextmanager
def serve_media_stub(tls: ssl.SSLContext | None = None) -> Iterator[MediaStub]:
    """The stand-in on its own Trio loop in a background thread, stopped on every exit;
    over HTTPS with the server context *tls*."""
    stub = MediaStub(tls)
    ready = threading.Event()
    loop: dict[str, Any] = {}

    async def main() -> None:
        with trio.CancelScope() as scope:
            loop["scope"], loop["token"] = scope, trio.lowlevel.current_trio_token()
            async with trio.open_nursery() as nursery:
                await nursery.start(stub.serve)
                ready.set()

    thread = threading.Thread(target=trio.run, args=(main,), name="media-stub", daemon=True)
    thread.start()
    if not ready.wait(10):
        raise RuntimeError("the media stub did not start")
    try:
        yield stub
    finally:
        trio.from_thread.run_sync(loop["scope"].cancel, trio_token=loop["token"])
        thread.join(10)


@pytest.fixture
def media_stub() -> Iterator[MediaStub]:
    """A fresh media-stack stand-in for this test."""
    with serve_media_stub() as stub:
        yield stub


async def _main() -> None:
    """``python -m tests.media_stub``: serve in a process of its own; print the base URL,
    serve until stdin closes, then print how many requests arrived."""
    stub = MediaStub()
    async with trio.open_nursery() as nursery:
        await nursery.start(stub.serve)
        print(stub.base_url, flush=True)
        await trio.to_thread.run_sync(sys.stdin.read)
        with contextlib.suppress(BrokenPipeError):  # the parent stopped listening
            print(len(stub.requests), flush=True)
        nursery.cancel_scope.cancel()


if __name__ == "__main__":
    trio.run(_main)
