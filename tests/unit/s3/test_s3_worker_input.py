"""The real S3 worker process against odd HEAD responses: each is a Poison (or Transient)
answer for its own request, and the worker lives on to answer the next one.

The responses come from a tiny local HTTP server (raw bytes, so headers can hold what no
well-behaved S3 would send); no mock of the worker or of libcurl.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from urllib.parse import unquote

import attrs
import pytest
import trio

from actors.s3.objectstore import Found, HeadOutcome, Poison, Transient
from actors.s3.process import open_object_store
from supervision.config import S3Config
from supervision.secrets import Secret

GOOD = (b"Content-Type: audio/ogg\r\nContent-Length: 64\r\n"
        b"x-amz-meta-duration-seconds: 42\r\n")


def _head(status: bytes, headers: bytes) -> bytes:
    return b"HTTP/1.1 " + status + b"\r\nConnection: close\r\n" + headers + b"\r\n"


RESPONSES: dict[str, bytes] = {
    "good": _head(b"200 OK", GOOD),
    # '²'.isdigit() is True but int('²') raises
    "superscript-duration": _head(b"200 OK", GOOD.replace(b": 42", b": \xb2")),
    # int() refuses strings past 4,300 digits
    "huge-duration": _head(b"200 OK", GOOD.replace(b": 42", b": " + b"9" * 5000)),
    "duration-past-int4": _head(b"200 OK", GOOD.replace(b": 42", b": 2147483648")),
    "superscript-length": _head(b"200 OK", GOOD.replace(b": 64", b": 6\xb2")),
    # one header line past libcurl's 100 KB limit
    "header-line-too-long": _head(b"200 OK", GOOD + b"x-amz-meta-pad: " + b"a" * 200_000
                                  + b"\r\n"),
    # many small lines past our own 64 KiB budget
    "too-many-headers": _head(b"200 OK", GOOD + b"".join(
        b"x-amz-meta-k%d: %s\r\n" % (n, b"v" * 80) for n in range(2000))),
    "control-chars-in-type": _head(b"200 OK", GOOD.replace(b"audio/ogg", b"audio/\x01og\xff")),
    "error-code-bomb": _head(b"503 Slow Down",
                             b"Content-Length: 0\r\nx-amz-error-code: " + b"X\x7f" * 3000
                             + b"\r\n"),
    "garbage-status-line": b"HTTP/1.1 abc\r\n" + GOOD + b"\r\n",
    "not-http": b"\x00\x01\x02 hello\r\n\r\n",
}


RID = "0f8e1c52-6c39-4a55-9d0e-3f4b0c7d2a11"


def _listing(body: bytes) -> bytes:
    return _head(b"200 OK", b"Content-Length: %d\r\n" % len(body)) + body


LISTINGS: dict[str, bytes] = {  # ListObjectsV2 answers, by the prefix asked for
    "ok/": _listing(b"<ListBucketResult><Contents><Key>ok/" + RID.encode()
                    + b"</Key></Contents></ListBucketResult>"),
    "big/": _listing(b"<ListBucketResult>" + b"<Contents><Key>big/x</Key></Contents>"
                     * 20_000 + b"</ListBucketResult>"),
}


async def _serve(stream: trio.SocketStream) -> None:
    head = b""
    try:
        while b"\r\n\r\n" not in head:
            chunk = await stream.receive_some(65536)
            if not chunk:
                return
            head += chunk
        target = head.split(b" ", 2)[1].decode()
        if "list-type=2" in target:
            prefix = unquote(target.split("prefix=", 1)[1].split("&")[0])
            await stream.send_all(LISTINGS[prefix])
            return
        await stream.send_all(RESPONSES[target.rsplit("/", 1)[-1]])
    except trio.BrokenResourceError:
        pass  # the worker aborted the transfer (headers past its budget)
    finally:
        await stream.aclose()


@pytest.fixture
async def odd_s3(nursery: trio.Nursery) -> AsyncIterator[S3Config]:
    listeners = await nursery.start(functools.partial(trio.serve_tcp, _serve, 0,
                                                      host="127.0.0.1"))
    port = listeners[0].socket.getsockname()[1]
    yield S3Config(endpoint_url=f"http://127.0.0.1:{port}", timeout=5.0, concurrency=2,
                   access_key_id=Secret("AKIDODD"), secret_access_key=Secret("odd-secret"))


def _is_row_verdict(outcome: HeadOutcome) -> bool:
    return isinstance(outcome, Poison | Transient)


@pytest.mark.parametrize("case", [c for c in RESPONSES if c != "good"])
async def test_worker_answers_an_odd_response_for_that_row_and_lives_on(
        odd_s3: S3Config, case: str) -> None:
    """The odd response gets a Poison/Transient answer with a printable reason; the same
    worker process (no restart) then answers a good HEAD."""
    async with open_object_store(odd_s3) as store:
        outcome = await store.head_recording(case)
        assert _is_row_verdict(outcome), outcome
        assert isinstance(outcome, Poison | Transient)
        assert outcome.error.isascii() and outcome.error.isprintable()
        assert len(outcome.error) <= 300
        assert await store.head_recording("good") == Found(
            "call-recordings/good", 64, "Ogg", 42)
        assert store.starts == 1


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("superscript-duration", Poison("duration_invalid:?")),
        ("huge-duration", Poison("duration_invalid:" + "9" * 32)),
        ("duration-past-int4", Poison("duration_invalid:2147483648")),
        ("superscript-length", Poison("response_unreadable:malformed_response")),
        ("too-many-headers", Poison("response_unreadable:headers_too_large")),
        ("header-line-too-long", Poison("response_unreadable:headers_too_large")),
    ],
)
async def test_odd_metadata_is_poison_with_its_reason(odd_s3: S3Config, case: str,
                                                      expected: HeadOutcome) -> None:
    """Metadata that cannot be adopted quarantines the row, saying why."""
    async with open_object_store(odd_s3) as store:
        assert await store.head_recording(case) == expected


async def test_a_listing_is_read_and_the_same_handles_then_head_again(
        odd_s3: S3Config) -> None:
    """The evidence listing is a GET with a body on a handle of the HEAD pool: its
    recording-named key is found, a body past 256 KiB is unreadable (not evidence, the
    worker lives on), and the next requests on those handles are HEADs again."""
    good = Found("ok/good", 64, "Ogg", 42)
    async with open_object_store(attrs.evolve(odd_s3, key_prefix="ok/")) as store:
        assert await store.list_recordings() == Found("ok/" + RID, 0, "", 0)
        for _ in range(3):  # concurrency 2: every handle has served a listing or a HEAD
            assert [await store.head_recording("good"), await store.list_recordings()] == [
                good, Found("ok/" + RID, 0, "", 0)]
        assert store.starts == 1
    async with open_object_store(attrs.evolve(odd_s3, key_prefix="big/")) as store:
        assert await store.list_recordings() == Transient("response_unreadable:body_too_large")
        assert await store.head_recording("good") == Found("big/good", 64, "Ogg", 42)
        assert store.starts == 1
