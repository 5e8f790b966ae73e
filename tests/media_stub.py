"""A real HTTP server on loopback standing in for the media stack's recorder API (SPEC §5).

>>> with serve_media_stub() as media:
...     media.answer(recording_id, 500)        # or media.hang(recording_id)
...     ...                                    # POST {media.base_url}/recordings/{id}/stop
...     media.requests                         # what it received, in order

It records every request (method, path, headers, JSON body) before answering, so a test
that waited for the sender to finish sees every request that reached the server. Stops
answer 200 unless told otherwise; a hung request is held until the stub stops.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import attrs
import pytest

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
    def __init__(self, server: ThreadingHTTPServer) -> None:
        self._server = server
        self._lock = threading.Lock()
        self._requests: list[StubRequest] = []
        self._answers: dict[str, int] = {}
        self._hanging: set[str] = set()
        self.released = threading.Event()

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

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

    def _record(self, request: StubRequest) -> tuple[int, bool]:
        with self._lock:
            self._requests.append(request)
            rid = request.recording_id or ""
            return self._answers.get(rid, 200), rid in self._hanging


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out as separate writes

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode(errors="replace")
        stub = self.server.stub
        status, hang = stub._record(StubRequest(
            "POST", self.path, {k.lower(): v for k, v in self.headers.items()}, body))
        if hang:
            stub.released.wait(30)
        payload = b"{}"
        with contextlib.suppress(OSError):  # the client may have given up meanwhile
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        return None


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # the default 5 drops SYNs under a concurrent fan-out
    stub: MediaStub


@contextlib.contextmanager
def serve_media_stub() -> Iterator[MediaStub]:
    """The stand-in on 127.0.0.1 (a free port), stopped on every exit path."""
    server = _Server(("127.0.0.1", 0), _Handler)
    stub = MediaStub(server)
    server.stub = stub
    thread = threading.Thread(target=server.serve_forever, name="media-stub", daemon=True)
    thread.start()
    try:
        yield stub
    finally:
        stub.released.set()
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.fixture
def media_stub() -> Iterator[MediaStub]:
    """A fresh media-stack stand-in for this test."""
    with serve_media_stub() as stub:
        yield stub


def main() -> None:
    """``python -m tests.media_stub``: serve on a free port in a process of its own; print
    the base URL, serve until stdin closes, then print how many requests arrived."""
    import sys

    with serve_media_stub() as stub:
        print(stub.base_url, flush=True)
        sys.stdin.read()
        print(len(stub.requests), flush=True)


if __name__ == "__main__":
    main()
