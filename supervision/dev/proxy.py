"""A TCP forwarder with an off switch, for ``safetynet dev``'s simulated S3 outage.

While ``down`` is set, new connections are accepted and closed at once (the client sees
a reset: a transient error); otherwise bytes are piped both ways untouched.
"""

from __future__ import annotations

import trio


class OutageProxy:
    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.down = False
        self.port = 0
        self.refused = 0

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                    ) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started()
        await trio.serve_listeners(self._handle, listeners)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _handle(self, client: trio.SocketStream) -> None:
        async with client:
            if self.down:
                self.refused += 1
                return
            try:
                upstream = await trio.open_tcp_stream(*self.upstream)
            except OSError:
                return
            async with upstream, trio.open_nursery() as nursery:
                nursery.start_soon(_pipe, client, upstream, nursery.cancel_scope)
                nursery.start_soon(_pipe, upstream, client, nursery.cancel_scope)


async def _pipe(source: trio.SocketStream, sink: trio.SocketStream,
                done: trio.CancelScope) -> None:
    try:
        while data := await source.receive_some(65536):
            await sink.send_all(data)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    finally:
        done.cancel()
