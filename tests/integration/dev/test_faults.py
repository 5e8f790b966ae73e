"""The fault proxy itself: every fault does what it says, against a trivial TCP upstream
(protocol-agnostic faults) and against the real SeaweedFS (HTTP faults, SigV4 through it)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial

import httpx
import httpx_auth
import pytest
import trio
from trio.testing import wait_all_tasks_blocked

from supervision.dev.s3 import S3Server
from tests.faults import (
    SLOW_DOWN,
    FaultProxy,
    HttpRule,
    open_fault_proxy,
    s3_object,
    s3_proxy_fixture,  # noqa: F401
)

Handler = Callable[[trio.SocketStream], Awaitable[None]]


async def echo(stream: trio.SocketStream) -> None:
    async for data in stream:
        await stream.send_all(data)


@asynccontextmanager
async def upstream_and_proxy(handler: Handler = echo) -> AsyncIterator[FaultProxy]:
    """A trivial TCP server on a free port, and a TCP-mode proxy in front of it."""
    async with trio.open_nursery() as nursery:
        (listener,) = await nursery.start(
            partial(trio.serve_tcp, handler, 0, host="127.0.0.1"))
        port = listener.socket.getsockname()[1]
        async with open_fault_proxy("127.0.0.1", port) as proxy:
            yield proxy
        nursery.cancel_scope.cancel()


async def roundtrip(proxy: FaultProxy, data: bytes = b"ping") -> bytes:
    async with await trio.open_tcp_stream("127.0.0.1", proxy.port) as stream:
        await stream.send_all(data)
        got = b""
        while len(got) < len(data) and (chunk := await stream.receive_some()):
            got += chunk
        return got


def s3_client(s3: S3Server, base_url: str, timeout: float = 5.0) -> httpx.AsyncClient:
    creds = s3.credentials
    auth = httpx_auth.AWS4Auth(access_id=creds.access_key_id,
                               secret_key=creds.secret_access_key,
                               region=creds.region, service="s3")
    return httpx.AsyncClient(base_url=base_url, auth=auth, timeout=timeout)


async def test_relays_bytes_both_ways() -> None:
    """With no fault set the proxy is a faithful TCP relay."""
    async with upstream_and_proxy() as proxy:
        assert await roundtrip(proxy, b"hello") == b"hello"
        assert proxy.connections == 1


async def test_down_refuses_connects_resets_live_ones_and_recovers_on_the_same_port() -> None:
    """down: ECONNREFUSED for new connects, RST for open ones; up again: same port works."""
    async with upstream_and_proxy() as proxy:
        port = proxy.port
        live = await trio.open_tcp_stream("127.0.0.1", port)
        await live.send_all(b"a")
        assert await live.receive_some(1) == b"a"
        proxy.down = True
        with pytest.raises(trio.BrokenResourceError) as broken:
            await live.receive_some(1)
        assert isinstance(broken.value.__cause__, ConnectionResetError)
        await live.aclose()
        with trio.socket.socket() as sock, pytest.raises(ConnectionRefusedError):
            await sock.connect(("127.0.0.1", port))
        proxy.down = False
        await wait_all_tasks_blocked()
        assert proxy.port == port
        assert await roundtrip(proxy) == b"ping"


async def test_blackhole_accepts_and_never_answers() -> None:
    """blackhole: the connect succeeds, nothing ever comes back, the upstream sees nothing."""
    accepted = 0

    async def counting_echo(stream: trio.SocketStream) -> None:
        nonlocal accepted
        accepted += 1
        await echo(stream)

    async with upstream_and_proxy(counting_echo) as proxy:
        proxy.faults.blackhole = True
        with trio.move_on_after(0.3) as waited:
            await roundtrip(proxy)
        assert waited.cancelled_caught
        assert accepted == 0
        proxy.faults.blackhole = False
        assert await roundtrip(proxy) == b"ping"


async def test_latency_delays_each_response_chunk() -> None:
    """latency(s): a round trip takes at least s."""
    async with upstream_and_proxy() as proxy:
        proxy.faults.latency = 0.25
        started = trio.current_time()
        assert await roundtrip(proxy) == b"ping"
        assert trio.current_time() - started >= 0.25


async def test_reset_after_relays_n_bytes_then_sends_an_rst() -> None:
    """reset_after=N: the client gets the first N response bytes, then ECONNRESET."""
    async def talker(stream: trio.SocketStream) -> None:
        await stream.receive_some(10)
        await stream.send_all(bytes(range(100)))
        await trio.sleep_forever()

    async with upstream_and_proxy(talker) as proxy:
        proxy.faults.reset_after = 10
        got = b""
        async with await trio.open_tcp_stream("127.0.0.1", proxy.port) as stream:
            await stream.send_all(b"go")
            with pytest.raises(trio.BrokenResourceError) as broken:
                while chunk := await stream.receive_some(1000):
                    got += chunk
        assert isinstance(broken.value.__cause__, ConnectionResetError)
        assert got == bytes(range(10))


async def test_bandwidth_caps_response_throughput() -> None:
    """bandwidth(b/s): 1000 bytes at 4000 B/s take about a quarter of a second."""
    async with upstream_and_proxy() as proxy:
        proxy.faults.bandwidth = 4000
        started = trio.current_time()
        assert await roundtrip(proxy, b"x" * 1000) == b"x" * 1000
        assert trio.current_time() - started >= 0.2


def key() -> str:
    return f"call-recordings/{uuid.uuid4()}"


async def test_http_rule_answers_object_heads_locally_only_the_first_n_times(
        s3_server: S3Server, s3_proxy: FaultProxy, bucket: str) -> None:
    """503 SlowDown for the first two object HEADs; the bucket HEAD and later requests reach
    SeaweedFS (signed requests pass through untouched), all on one keep-alive connection."""
    obj = f"/{bucket}/{key()}"
    s3_server.put_object(bucket, obj.split("/", 2)[2], b"abc", "audio/ogg")
    rule = HttpRule(s3_object("HEAD"), status=503, headers=SLOW_DOWN, times=2)
    s3_proxy.rules.append(rule)
    async with s3_client(s3_server, s3_proxy.url) as client:
        assert (await client.head(f"/{bucket}")).status_code == 200
        for _ in range(2):
            slow = await client.head(obj)
            assert slow.status_code == 503
            assert slow.headers["x-amz-error-code"] == "SlowDown"
        ok = await client.head(obj)
        assert (ok.status_code, ok.headers["content-length"]) == (200, "3")
        assert (await client.get(obj)).content == b"abc"
        assert (await client.head(f"/{bucket}/{key()}")).status_code == 404
    assert rule.hits == 2 and s3_proxy.connections == 1
    assert [r.method for r in s3_proxy.seen] == ["HEAD"] * 4 + ["GET", "HEAD"]


@pytest.mark.parametrize("status", [500, 403])
async def test_http_rule_answers_get_with_an_s3_error_body_and_keeps_the_connection(
        s3_server: S3Server, s3_proxy: FaultProxy, bucket: str, status: int) -> None:
    """A local answer to a GET has an S3-style XML body; the connection stays usable."""
    name = key()
    s3_server.put_object(bucket, name, b"body", "audio/ogg")
    s3_proxy.rules.append(HttpRule(s3_object("GET", keys={name}), status=status, times=1))
    async with s3_client(s3_server, s3_proxy.url) as client:
        failed = await client.get(f"/{bucket}/{name}")
        assert failed.status_code == status and b"<Error><Code>" in failed.content
        assert (await client.get(f"/{bucket}/{name}")).content == b"body"
    assert s3_proxy.connections == 1


async def test_http_request_bodies_are_forwarded(
        s3_server: S3Server, s3_proxy: FaultProxy, bucket: str) -> None:
    """A PUT with a Content-Length body goes through the proxy intact."""
    name = key()
    async with s3_client(s3_server, s3_proxy.url) as client:
        put = await client.put(f"/{bucket}/{name}", content=b"z" * 70_000,
                               headers={"Content-Type": "audio/ogg"})
        assert put.status_code == 200
    assert s3_server.head_object(bucket, name)["content-length"] == "70000"


async def test_http_reset_mid_response_is_a_read_error_for_httpx(
        s3_server: S3Server, s3_proxy: FaultProxy, bucket: str) -> None:
    """reset_after on one request: httpx sees the RST as ReadError; the next request works."""
    s3_proxy.rules.append(HttpRule(s3_object("HEAD"), reset_after=12, times=1))
    async with s3_client(s3_server, s3_proxy.url) as client:
        with pytest.raises(httpx.ReadError):
            await client.head(f"/{bucket}/{key()}")
        assert (await client.head(f"/{bucket}/{key()}")).status_code == 404
    assert s3_proxy.connections == 2


async def test_http_latency_rule_makes_httpx_time_out(
        s3_server: S3Server, s3_proxy: FaultProxy, bucket: str) -> None:
    """A per-request delay beyond the client's timeout is a ReadTimeout; the bucket HEAD
    (not matched) is not delayed."""
    s3_proxy.rules.append(HttpRule(s3_object("HEAD"), latency=1.0))
    async with s3_client(s3_server, s3_proxy.url, timeout=0.3) as client:
        assert (await client.head(f"/{bucket}")).status_code == 200
        with pytest.raises(httpx.ReadTimeout):
            await client.head(f"/{bucket}/{key()}")


async def test_http_hold_rule_forwards_at_once_and_answers_after_the_latency(
        s3_server: S3Server, s3_proxy: FaultProxy, bucket: str) -> None:
    """``hold``: the store answers at once (the object is created after the request
    arrived, and the held answer is still its 404) and the client gets that answer no
    sooner than the latency after sending — a store that takes that long to answer."""
    s3_proxy.rules.append(HttpRule(s3_object("HEAD"), latency=0.6, hold=True))
    name = key()
    async with s3_client(s3_server, s3_proxy.url) as client:
        status: list[int] = []

        async def head() -> None:
            status.append((await client.head(f"/{bucket}/{name}")).status_code)

        async with trio.open_nursery() as nursery:
            sent = trio.current_time()
            nursery.start_soon(head)
            await trio.sleep(0.3)
            assert not status  # still held
            s3_server.put_object(bucket, name, b"abc", "audio/ogg")
        assert status == [404] and trio.current_time() - sent >= 0.6
        assert (await client.head(f"/{bucket}/{name}")).status_code == 200  # the store had it
