"""A fault-injecting TCP proxy with an HTTP/1.1 mode, for integration and chaos tests (Trio).

>>> async with open_fault_proxy("127.0.0.1", 8333, http=True) as proxy:  # 127.0.0.1:<free>
...     proxy.rules.append(HttpRule(s3_object("HEAD"), status=503, headers=SLOW_DOWN, times=2))
...     proxy.faults.latency = 1.5        # every connection, from the next chunk on
...     proxy.down = True                 # connections refused (and live ones reset)

Two layers of faults, both switchable at any time from the test:

* **TCP** (``proxy.down``, ``proxy.faults``) — protocol-agnostic, for S3, Kafka and
  PostgreSQL alike. They are read on every relayed chunk, so they hit live connections
  too. ``down`` closes the listening socket (a connect gets ECONNREFUSED) and resets every
  open connection; setting it back to False listens again on the same port. ``blackhole``
  accepts and never answers (nothing is forwarded either way); ``latency`` delays each
  upstream→client chunk; ``bandwidth`` caps upstream→client bytes/s; ``reset_after``
  relays the first N upstream→client bytes of a connection (of each response, in HTTP
  mode) and then sends an RST (SO_LINGER 0), not a FIN.
* **HTTP** (``FaultProxy(..., http=True)``, ``proxy.rules``) — each request of an HTTP/1.1
  keep-alive connection is parsed (request line, headers, Content-Length body) and the
  first :class:`HttpRule` that matches it and has ``times`` left decides: answer it
  locally with ``status`` (HEAD answers have no body), or delay, reset mid-response or
  blackhole that one request. A delay (``latency`` ± ``jitter``) holds the request back
  before forwarding it; with ``hold`` the request goes on at once and its answer is held
  until the delay has passed since the request arrived — a store that takes that long to
  answer, with the upstream's own time and the proxy's forwarding inside the delay.
  Anything else is forwarded and exactly one response relayed back (by Content-Length;
  no body for HEAD, 1xx, 204, 304). A request with a chunked or
  ``Expect: 100-continue`` body turns its connection into a plain TCP tunnel; a response
  without a length is relayed until the server closes.

``proxy.seen`` lists every parsed request and ``proxy.connections`` counts accepted ones.

What cancellation does: cancelling the nursery that runs :meth:`FaultProxy.serve` closes
the listener and every connection (each handler's ``finally``).
"""

from __future__ import annotations

import http
import random
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping
from contextlib import asynccontextmanager
from functools import partial
from typing import Any
from urllib.parse import unquote, urlsplit

import attrs
import pytest
import trio

from supervision.dev.s3 import S3Server
from supervision.dev.uploads import Upload, object_headers

SLOW_DOWN = {"x-amz-error-code": "SlowDown"}
_HEAD_END = b"\r\n\r\n"
_MAX_HEAD = 64 * 1024


@attrs.define
class TcpFaults:
    """Connection-level faults; the defaults relay faithfully."""

    blackhole: bool = False
    latency: float = 0.0             # seconds before each upstream->client chunk
    bandwidth: float | None = None   # upstream->client bytes per second
    reset_after: int | None = None   # RST the client after this many upstream->client bytes


@attrs.frozen
class HttpRequest:
    method: str
    target: str
    headers: Mapping[str, str]  # names lower-cased

    @property
    def path(self) -> str:
        return unquote(self.target.split("?", 1)[0])


@attrs.define
class HttpRule:
    """What to do with the requests *match* accepts (the first *times* of them, if set)."""

    match: Callable[[HttpRequest], bool]
    status: int | None = None        # answer locally; the server never sees the request
    headers: Mapping[str, str] = attrs.field(factory=dict)  # added to the local answer
    latency: float = 0.0             # forward after this delay
    jitter: float = 0.0              # ... plus a uniform draw from [-jitter, +jitter]
    hold: bool = False               # forward at once, answer *latency* after arrival
    reset_after: int | None = None   # forward, then RST after N response bytes
    blackhole: bool = False          # swallow the request and never answer
    times: int | None = None
    hits: int = 0


def s3_object(method: str = "HEAD", prefix: str = "call-recordings/",
              keys: Collection[str] | None = None) -> Callable[[HttpRequest], bool]:
    """Match path-style requests on objects under *prefix* (never the bucket itself),
    optionally only the object keys in *keys*."""
    def match(req: HttpRequest) -> bool:
        bucket_and_key = req.path.lstrip("/").split("/", 1)
        if req.method != method or len(bucket_and_key) != 2:
            return False
        key = bucket_and_key[1]
        return key.startswith(prefix) and (keys is None or key in keys)
    return match


class _Reset(Exception):
    """The client connection is to be reset on purpose (a ``reset_after`` fault)."""


class _Buffered:
    """A stream with a read buffer, to parse HTTP heads and relay exact byte counts."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.buf = bytearray()

    async def _fill(self) -> bool:
        data = await self.stream.receive_some(65536)
        self.buf += data
        return bool(data)

    async def read_head(self) -> bytes | None:
        """The next head up to the blank line, or None at a clean EOF between messages."""
        while (end := self.buf.find(_HEAD_END)) < 0:
            if len(self.buf) > _MAX_HEAD:
                raise trio.BrokenResourceError("HTTP head too large")
            if not await self._fill():
                if self.buf:
                    raise trio.BrokenResourceError("EOF inside an HTTP head")
                return None
        head = bytes(self.buf[:end + 4])
        del self.buf[:end + 4]
        return head

    async def relay(self, count: int | None, emit: Callable[[bytes], Awaitable[None]]) -> None:
        """Pass exactly *count* bytes (all until EOF when None) to *emit*, as they come."""
        while count is None or count > 0:
            if not self.buf and not await self._fill():
                if count:
                    raise trio.BrokenResourceError("EOF inside an HTTP body")
                return
            take = len(self.buf) if count is None else min(count, len(self.buf))
            chunk = bytes(self.buf[:take])
            del self.buf[:take]
            if count is not None:
                count -= take
            await emit(chunk)


@attrs.define(eq=False)
class _Conn:
    client: _Buffered
    scope: trio.CancelScope
    upstream: _Buffered | None = None
    sent: int = 0  # upstream->client bytes (of the current response, in HTTP mode)

    def abort(self) -> None:
        _linger_zero(self.client.stream)
        self.scope.cancel()


def _linger_zero(stream: trio.SocketStream) -> None:
    """Make the next close send an RST instead of a FIN."""
    stream.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def _parse(head: bytes) -> tuple[list[str], dict[str, str]]:
    first, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return first.split(" ", 2), headers


def _local_answer(req: HttpRequest, rule: HttpRule) -> bytes:
    assert rule.status is not None
    phrase = http.HTTPStatus(rule.status).phrase
    code = rule.headers.get("x-amz-error-code", phrase.replace(" ", ""))
    body = b"" if req.method == "HEAD" else (
        f"<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>{code}</Code>"
        "<Message>injected by FaultProxy</Message></Error>").encode()
    fields = {"Content-Length": str(len(body)), "Content-Type": "application/xml",
              "x-amz-request-id": "faultproxy"}
    given = {name.lower() for name in rule.headers}  # a rule's header replaces a default
    lines = [f"HTTP/1.1 {rule.status} {phrase}",
             *(f"{name}: {value}" for name, value in fields.items()
               if name.lower() not in given),
             *(f"{name}: {value}" for name, value in rule.headers.items())]
    return "\r\n".join(lines).encode("latin-1") + _HEAD_END + body


class FaultProxy:
    """Relays 127.0.0.1:``port`` to the upstream server, injecting the configured faults."""

    def __init__(self, upstream_host: str, upstream_port: int, *, http: bool = False,
                 host: str = "127.0.0.1") -> None:
        self.upstream = (upstream_host, upstream_port)
        self.http = http
        self.host = host
        self.port = 0
        self.faults = TcpFaults()
        self.rules: list[HttpRule] = []
        self.seen: list[HttpRequest] = []
        self.connections = 0
        self.held: list[float] = []  # hold rules: seconds each answer went out past its time
        self._down = False
        self._up = trio.Event()
        self._listener: trio.SocketListener | None = None
        self._live: set[_Conn] = set()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def down(self) -> bool:
        return self._down

    @down.setter
    def down(self, value: bool) -> None:
        if value == self._down:
            return
        self._down = value
        if not value:
            self._up.set()
            return
        self._up = trio.Event()
        if self._listener is not None:
            self._listener.socket.close()  # refuse from now on, not from the next tick
        for conn in list(self._live):
            conn.abort()

    def clear(self) -> None:
        """Back to a faithful relay: no rules, no TCP faults, up."""
        self.faults = TcpFaults()
        self.rules.clear()
        self.down = False

    async def serve(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED
                    ) -> None:
        """Listen and relay until cancelled; ``task_status.started(port)`` once listening."""
        async with trio.open_nursery() as nursery:
            while True:
                if self._down:
                    await self._up.wait()
                    continue
                (listener,) = await trio.open_tcp_listeners(self.port, host=self.host)
                self._listener = listener
                self.port = listener.socket.getsockname()[1]
                task_status.started(self.port)
                task_status = trio.TASK_STATUS_IGNORED
                try:
                    async with listener:
                        while True:
                            nursery.start_soon(self._handle, await listener.accept())
                except trio.ClosedResourceError:
                    pass  # went down

    async def _handle(self, stream: trio.SocketStream) -> None:
        self.connections += 1
        with trio.CancelScope() as scope:
            conn = _Conn(_Buffered(stream), scope)
            self._live.add(conn)
            try:
                if self.faults.blackhole:
                    await conn.client.relay(None, self._drop)
                elif self.http:
                    await self._serve_http(conn)
                else:
                    await self._tunnel(conn)
            except* _Reset:
                _linger_zero(stream)
            except* (trio.BrokenResourceError, trio.ClosedResourceError, OSError, ValueError):
                pass  # a peer went away, the upstream refused, or garbage: close both sides
            finally:
                self._live.discard(conn)
                if conn.upstream is not None:
                    await conn.upstream.stream.aclose()
                await stream.aclose()

    async def _drop(self, data: bytes) -> None:
        await trio.lowlevel.checkpoint()

    async def _upstream(self, conn: _Conn) -> _Buffered:
        if conn.upstream is None:
            conn.upstream = _Buffered(await trio.open_tcp_stream(*self.upstream))
        return conn.upstream

    async def _tunnel(self, conn: _Conn) -> None:
        upstream = await self._upstream(conn)

        async def to_upstream(data: bytes) -> None:
            if not self.faults.blackhole:
                await upstream.stream.send_all(data)

        async def client_to_upstream() -> None:
            await conn.client.relay(None, to_upstream)
            await upstream.stream.send_eof()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(client_to_upstream)
            await upstream.relay(None, lambda data: self._emit(conn, data))
            nursery.cancel_scope.cancel()

    async def _emit(self, conn: _Conn, data: bytes, rule: HttpRule | None = None) -> None:
        """Send upstream bytes to the client through the TCP faults (and *rule*'s reset)."""
        faults = self.faults
        if faults.blackhole:
            return await trio.lowlevel.checkpoint()
        if faults.latency:
            await trio.sleep(faults.latency)
        limit = rule.reset_after if rule is not None and rule.reset_after is not None else (
            faults.reset_after)
        if limit is not None and conn.sent + len(data) > limit:
            await conn.client.stream.send_all(data[:max(0, limit - conn.sent)])
            raise _Reset
        step = max(1, int(faults.bandwidth / 20)) if faults.bandwidth else len(data)
        for start in range(0, len(data), step):
            piece = data[start:start + step]
            await conn.client.stream.send_all(piece)
            conn.sent += len(piece)
            if faults.bandwidth:
                await trio.sleep(len(piece) / faults.bandwidth)

    def _rule_for(self, req: HttpRequest) -> HttpRule | None:
        for rule in self.rules:
            if (rule.times is None or rule.hits < rule.times) and rule.match(req):
                rule.hits += 1
                return rule
        return None

    async def _serve_http(self, conn: _Conn) -> None:
        while (head := await conn.client.read_head()) is not None:
            (method, target, *_), headers = _parse(head)
            req = HttpRequest(method, target, headers)
            self.seen.append(req)
            if "chunked" in headers.get("transfer-encoding", "").lower() or "expect" in headers:
                await (await self._upstream(conn)).stream.send_all(head)
                return await self._tunnel(conn)
            body = bytearray()
            await conn.client.relay(int(headers.get("content-length", "0")),
                                    self._collect(body))
            rule = self._rule_for(req)
            conn.sent = 0
            if rule is not None and rule.blackhole:
                return await conn.client.relay(None, self._drop)
            if rule is not None and rule.status is not None:
                await self._emit(conn, _local_answer(req, rule))
                continue
            answer_at = None
            if rule is not None and (rule.latency or rule.jitter):
                delay = max(0.0, rule.latency + random.uniform(-rule.jitter, rule.jitter))
                if rule.hold:
                    answer_at = trio.current_time() + delay
                else:
                    await trio.sleep(delay)
            upstream = await self._upstream(conn)
            await upstream.stream.send_all(head + body)
            if not await self._relay_response(conn, req, upstream, rule, answer_at):
                return

    @staticmethod
    def _collect(into: bytearray) -> Callable[[bytes], Awaitable[None]]:
        async def collect(data: bytes) -> None:
            into.extend(data)
            await trio.lowlevel.checkpoint()
        return collect

    async def _relay_response(self, conn: _Conn, req: HttpRequest, upstream: _Buffered,
                              rule: HttpRule | None, answer_at: float | None = None) -> bool:
        """Relay one response (after any 1xx, not before *answer_at*); False when the
        connection must close."""
        status = 100
        while status < 200:
            head = await upstream.read_head()
            if head is None:
                return False
            if answer_at is not None:
                await trio.sleep_until(answer_at)
                self.held.append(trio.current_time() - answer_at)
            (_, code, *_), headers = _parse(head)
            status = int(code)
            await self._emit(conn, head, rule)
        length: int | None
        if req.method == "HEAD" or status in (204, 304):
            length = 0
        elif "content-length" in headers and "transfer-encoding" not in headers:
            length = int(headers["content-length"])
        else:
            length = None  # until the server closes
        await upstream.relay(length, lambda data: self._emit(conn, data, rule))
        closing = "close" in (headers.get("connection", "") + req.headers.get("connection", ""))
        return length is not None and not closing


@asynccontextmanager
async def open_fault_proxy(upstream_host: str, upstream_port: int, *, http: bool = False
                           ) -> AsyncIterator[FaultProxy]:
    """A running :class:`FaultProxy`, stopped (every connection closed) on exit."""
    proxy = FaultProxy(upstream_host, upstream_port, http=http)
    async with trio.open_nursery() as nursery:
        await nursery.start(proxy.serve)
        yield proxy
        nursery.cancel_scope.cancel()


@pytest.fixture(name="s3_proxy")
async def s3_proxy_fixture(s3_server: S3Server) -> AsyncIterator[FaultProxy]:
    """``s3_proxy``: an HTTP-mode FaultProxy in front of the session's SeaweedFS, fresh per
    test. Import ``s3_proxy_fixture`` into a test module to use it."""
    url = urlsplit(s3_server.endpoint_url)
    assert url.hostname is not None and url.port is not None
    async with open_fault_proxy(url.hostname, url.port, http=True) as proxy:
        yield proxy


async def put_recordings(s3: S3Server, bucket: str, recording_ids: Collection[str], *,
                         prefix: str = "call-recordings/", content_type: str = "audio/ogg",
                         duration: str | None = "42", body: bytes = b"OggS" + bytes(60)) -> None:
    """Upload binaries the way the recorder does (``{prefix}{id}``, Content-Type, duration
    metadata), straight to the server, eight at a time (:mod:`supervision.dev.uploads`, in
    a thread: the test's Trio loop runs on meanwhile)."""
    headers = object_headers(content_type,
                             None if duration is None else {"duration-seconds": duration})
    uploads = [Upload(f"{prefix}{rid}", body, headers) for rid in recording_ids]
    await trio.to_thread.run_sync(partial(s3.put_objects, bucket, uploads, concurrency=8))


def refuse_batches_over(monkeypatch: pytest.MonkeyPatch, limit: int) -> list[int]:
    """Make the broker behave as one whose ``message.max.bytes`` is *limit*: every record
    batch larger than it is refused whole with ``MessageSizeTooLarge`` (the broker's
    answer), the rest go to the real broker. Returns the record counts of the refused
    batches, as they happen."""
    import asyncio

    from aiokafka import AIOKafkaProducer
    from aiokafka.errors import MessageSizeTooLargeError

    original = AIOKafkaProducer.send_batch
    refused: list[int] = []

    async def send_batch(self: AIOKafkaProducer, batch: Any, topic: str, *,
                         partition: int) -> Any:
        if batch.size() > limit:
            refused.append(batch.record_count())
            future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            future.set_exception(MessageSizeTooLargeError())
            return future
        return await original(self, batch, topic, partition=partition)

    monkeypatch.setattr(AIOKafkaProducer, "send_batch", send_batch)
    return refused
