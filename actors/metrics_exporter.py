"""The metrics exporter: ``/metrics``, ``/healthz`` and ``/readyz`` on ``http.listen``.

>>> await nursery.start(serve_metrics_exporter, "127.0.0.1:9464", readiness)

Inputs: the listen address and a :class:`Readiness` probe. Outputs: HTTP responses —
``/metrics`` in the Prometheus text format produced by prometheus-client itself (no
hand-written exposition), ``/healthz`` 200 while the root supervisor runs and 503 from the
moment it shuts down or escalates, ``/readyz`` 200 only when the root runs, PostgreSQL
answers and no configuration fault is active; every 503 carries a one-line reason.
Restart type: permanent.

Each connection is its own task with a read/write deadline, so a slow or stuck scraper
holds nothing but its own socket; HTTP parsing is h11's. Binds loopback by default.
Hostile clients (issue #26): at most ``MAX_CONNECTIONS`` connections at once — a
newcomer past it takes the slot of the oldest connection still sending its request, so
idle or slow-sending connections (a slowloris) cannot keep a prober out; a request must
arrive within ``HEAD_DEADLINE`` and fit ``MAX_REQUEST_BYTES``; running out of
descriptors, refusals and broken connections each log at most one line a minute (with
the count held back), never a traceback per connection.

What cancellation does: the listener closes and in-flight responses are dropped.
"""

from __future__ import annotations

import contextlib
import errno
import math
from collections.abc import Awaitable, Callable

import attrs
import h11
import prometheus_client
import structlog
import trio

from supervision.tree.health import HEALTH

log = structlog.get_logger("metrics_exporter")

REQUEST_DEADLINE = 5.0  # the whole exchange of one connection
HEAD_DEADLINE = 2.0  # the request line and headers must have arrived by then (slowloris)
MAX_REQUEST_BYTES = 16 * 1024
MAX_CONNECTIONS = 64  # open at once; well below any descriptor limit the daemon runs with
ERROR_LOG_INTERVAL = 60.0  # one line per kind of connection trouble per minute at most
ACCEPT_RETRY = 0.1  # out of descriptors: accept again after this long
_CAPACITY_ERRNOS = {errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS}


@attrs.define
class Readiness:
    """``/readyz``'s verdict: PostgreSQL answers and no configuration fault is active.

    The database check runs at most every ``cache_s`` seconds whatever the scrape rate."""

    ping_db: Callable[[], Awaitable[None]]
    cache_s: float = 1.0
    _checked_at: float = -1e9
    _db_error: str | None = None

    async def reason(self) -> str | None:
        now = trio.current_time()
        if now - self._checked_at >= self.cache_s:
            self._checked_at = now
            try:
                with trio.fail_after(2.0):
                    await self.ping_db()
                self._db_error = None
            except (Exception, trio.TooSlowError) as exc:  # any failure means "not ready"
                self._db_error = f"postgres unavailable: {type(exc).__name__}"
        # bounded, no host names: the whole reasons are in the log
        return HEALTH.liveness_reason() or self._db_error or HEALTH.summary()


# listeners a reload bound before the old tree stopped, by http.listen: the next exporter
# serving that address takes them (one process, one exporter at a time)
_PREBOUND: dict[str, list[trio.SocketListener]] = {}


async def prebind(listen: str) -> None:
    """Bind *listen* now for the next exporter (a reload moving ``http.listen``); raises
    :class:`OSError` when it cannot be bound. Sockets an earlier, superseded reload bound
    are closed first."""
    for stale in list(_PREBOUND):
        for listener in _PREBOUND.pop(stale):
            await listener.aclose()
    host, port = split_listen(listen)
    _PREBOUND[listen] = await trio.open_tcp_listeners(port, host=host)


def split_listen(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    return host.strip("[]"), int(port)


async def serve_metrics_exporter(
    listen: str, readiness: Readiness, *, max_connections: int = MAX_CONNECTIONS,
    task_status: trio.TaskStatus[list[trio.SocketListener]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve until cancelled; reports its listeners (so tests can bind port 0)."""
    listeners = _PREBOUND.pop(listen, None)
    if listeners is None:
        host, port = split_listen(listen)
        listeners = await trio.open_tcp_listeners(port, host=host)
    host = split_listen(listen)[0]
    log.info("http_listening", listen=f"{host}:{listeners[0].socket.getsockname()[1]}")
    task_status.started(listeners)
    slots = _Slots(max_connections)
    errors = RateLimitedLog(ERROR_LOG_INTERVAL)
    async with trio.open_nursery() as nursery:
        for listener in listeners:
            nursery.start_soon(_accept_loop, listener, readiness, slots, errors, nursery)


@attrs.define(eq=False)
class _Connection:
    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    reading: bool = True  # still reading its request: may be evicted for a newcomer
    released: bool = False


@attrs.define(eq=False)
class _Slots:
    """At most *limit* connections at once. A newcomer past the limit takes the slot of
    the oldest connection still reading its request (idle or slow: a slowloris), which
    is closed; when every slot is answering a request, the newcomer is closed at once."""

    limit: int
    open: list[_Connection] = attrs.field(factory=list)

    def admit(self) -> _Connection | None:
        if len(self.open) >= self.limit:
            oldest = next((c for c in self.open if c.reading), None)
            if oldest is None:
                return None
            self.release(oldest)
            oldest.scope.cancel()
        conn = _Connection()
        self.open.append(conn)
        return conn

    def release(self, conn: _Connection) -> None:
        if not conn.released:
            conn.released = True
            self.open.remove(conn)


@attrs.define(eq=False)
class RateLimitedLog:
    """One error line per *interval* for a kind of trouble, with how many were held back
    (a flood of bad connections must not flood the log)."""

    interval: float
    _last: dict[str, float] = attrs.field(factory=dict)
    _held: dict[str, int] = attrs.field(factory=dict)

    def __call__(self, event: str, **fields: object) -> None:
        now = trio.current_time()
        if now - self._last.get(event, -math.inf) < self.interval:
            self._held[event] = self._held.get(event, 0) + 1
            return
        self._last[event] = now
        log.warning(event, suppressed=self._held.pop(event, 0), **fields)


async def _accept_loop(listener: trio.SocketListener, readiness: Readiness, slots: _Slots,
                       errors: RateLimitedLog, nursery: trio.Nursery) -> None:
    while True:
        try:
            stream = await listener.accept()
        except OSError as exc:
            if exc.errno not in _CAPACITY_ERRNOS:
                raise
            errors("http_accept_failed", error=errno.errorcode.get(exc.errno or 0, "?"))
            await trio.sleep(ACCEPT_RETRY)
            continue
        conn = slots.admit()
        if conn is None:
            errors("http_connection_refused", reason="every connection slot is answering")
            with contextlib.suppress(trio.BrokenResourceError, OSError):
                await trio.aclose_forcefully(stream)
            continue
        nursery.start_soon(_handle, readiness, stream, conn, slots, errors)


async def _handle(readiness: Readiness, stream: trio.SocketStream, slot: _Connection,
                  slots: _Slots, errors: RateLimitedLog) -> None:
    """Answer one request; a client that hung up (a scraper's own timeout while /readyz
    waits on a slow database) only ends its own connection, never the exporter. The
    request must arrive within HEAD_DEADLINE and be at most MAX_REQUEST_BYTES; the whole
    exchange takes at most REQUEST_DEADLINE."""
    try:
        async with stream:
            with slot.scope, trio.move_on_after(REQUEST_DEADLINE), \
                    contextlib.suppress(trio.BrokenResourceError):
                conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_REQUEST_BYTES)
                request = None
                with trio.move_on_after(HEAD_DEADLINE):
                    request = await _read_request(conn, stream)
                slot.reading = False
                if request is None:
                    return
                status, content_type, body = await _route(readiness, request)
                headers = [("content-type", content_type),
                           ("content-length", str(len(body))),
                           ("connection", "close"), ("cache-control", "no-store")]
                await stream.send_all(conn.send(h11.Response(status_code=status,
                                                             headers=headers)))
                if request.method != b"HEAD":
                    await stream.send_all(conn.send(h11.Data(data=body)))
                await stream.send_all(conn.send(h11.EndOfMessage()))
    except (OSError, h11.ProtocolError) as exc:  # one client's trouble, never the exporter's
        errors("http_connection_failed", error=type(exc).__name__)
    finally:
        slots.release(slot)


async def _read_request(conn: h11.Connection, stream: trio.SocketStream) -> h11.Request | None:
    while True:
        try:
            event = conn.next_event()
        except h11.RemoteProtocolError:
            return None
        if isinstance(event, h11.Request):
            return event
        if event is h11.NEED_DATA:
            data = await stream.receive_some(4096)
            conn.receive_data(data)
            if not data:
                return None
        elif isinstance(event, h11.ConnectionClosed):
            return None


async def _route(readiness: Readiness, request: h11.Request) -> tuple[int, str, bytes]:
    path = request.target.split(b"?", 1)[0]
    if request.method not in (b"GET", b"HEAD"):
        return 405, "text/plain; charset=utf-8", b"method not allowed\n"
    if path == b"/metrics":
        return 200, prometheus_client.CONTENT_TYPE_LATEST, prometheus_client.generate_latest()
    if path == b"/healthz":
        unhealthy = HEALTH.liveness_reason()
        if unhealthy is None:
            return 200, "text/plain; charset=utf-8", b"ok\n"
        return 503, "text/plain; charset=utf-8", f"unhealthy: {unhealthy}\n".encode()
    if path == b"/readyz":
        reason = await readiness.reason()
        if reason is None:
            return 200, "text/plain; charset=utf-8", b"ready\n"
        return 503, "text/plain; charset=utf-8", f"not ready: {reason}\n".encode()
    return 404, "text/plain; charset=utf-8", b"not found\n"
