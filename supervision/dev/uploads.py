"""Bulk PUTs to the dev stack's object store, the way a recorder uploads its binaries.

>>> put_objects(s3.endpoint_url, s3.credentials, "recordings",
...             [Upload("call-recordings/<id>", body, object_headers("audio/ogg", {...}))])

libcurl does the HTTP and the SigV4 signing (``CURLOPT_AWS_SIGV4``, as the daemon's S3
worker does for its HEADs), *concurrency* requests on the wire over kept-alive
connections, in the calling thread (async callers use ``trio.to_thread.run_sync``: pycurl
lets go of the GIL while it waits). The tests and the demo seed tens of thousands of
binaries a run: through httpx and httpx-auth each PUT cost the caller 1.8-2.0 ms of CPU
and SeaweedFS about 1.5 ms, here 0.13 ms and 0.7-0.8 ms (``bench/uploads.py``).

SeaweedFS answers 500 "please try again" while it grows a volume: a 5xx answer or a
transport error is tried again, up to *attempts* times, after a short pause; any other
status of 300 or more fails at once. What still failed after that raises
:class:`UploadError` naming the first few keys and why.
"""

from __future__ import annotations

import collections
import io
import time
from collections.abc import Iterable, Mapping
from urllib.parse import quote

import attrs
import pycurl

from supervision.errors import SafetynetError


@attrs.frozen
class S3Credentials:
    """A key pair and region that SigV4 signs with (the dev S3 server's, a test's)."""

    access_key_id: str
    secret_access_key: str
    region: str = "us-east-1"


SHOWN_FAILURES = 3  # keys named in the error; the rest are counted


class UploadError(SafetynetError):
    """Some PUTs still failed after their retries."""


@attrs.frozen
class Upload:
    """One object: its key in the bucket, its bytes and its request headers."""

    key: str
    body: bytes
    headers: Mapping[str, str] = attrs.field(factory=dict)


def object_headers(content_type: str | None = None,
                   metadata: Mapping[str, str] | None = None) -> dict[str, str]:
    """The headers of a PUT: ``Content-Type`` (none when *content_type* is None, as an
    object without one is stored) and each *metadata* item as ``x-amz-meta-<name>``."""
    headers = {f"x-amz-meta-{name}": value for name, value in (metadata or {}).items()}
    if content_type is not None:
        headers["Content-Type"] = content_type
    return headers


@attrs.define
class _Put:
    upload: Upload
    attempt: int = 1
    answer: io.BytesIO = attrs.field(factory=io.BytesIO)


def put_objects(endpoint_url: str, signer: S3Credentials, bucket: str, uploads: Iterable[Upload],
                *, concurrency: int = 16, attempts: int = 4, timeout: float = 30.0) -> None:
    """PUT every upload into *bucket* at *endpoint_url*, signed by *signer*; raises
    :class:`UploadError` if any still failed after *attempts* tries."""
    queued = collections.deque(_Put(upload) for upload in uploads)  # in the given order
    failed: list[str] = []
    multi = pycurl.CurlMulti()
    idle = [_handle(signer, timeout) for _ in range(max(1, min(concurrency, len(queued))))]
    running: dict[pycurl.Curl, _Put] = {}
    retry: collections.deque[_Put] = collections.deque()
    try:
        while queued or running or retry:
            if not queued and not running:  # only retries left: a short pause, then again
                time.sleep(0.2 * retry[0].attempt)
                queued, retry = retry, collections.deque()
            while idle and queued:
                put = queued.popleft()
                handle = idle.pop()
                _prepare(handle, endpoint_url, bucket, put)
                running[handle] = put
                multi.add_handle(handle)
            _perform(multi)
            _, done, errors = multi.info_read()
            finished: list[tuple[pycurl.Curl, str | None]] = [(h, None) for h in done]
            finished += [(handle, message) for handle, _code, message in errors]
            for handle, transport_error in finished:
                put = running.pop(handle)
                multi.remove_handle(handle)
                idle.append(handle)
                status = 0 if transport_error else int(handle.getinfo(pycurl.RESPONSE_CODE))
                if status and status < 300:
                    continue
                why = transport_error or f"{status} {put.answer.getvalue()[:200]!r}"
                if (transport_error or status >= 500) and put.attempt < attempts:
                    retry.append(_Put(put.upload, put.attempt + 1))
                else:
                    failed.append(f"{put.upload.key}: {why}")
            if running:
                multi.select(1.0)
    finally:
        for handle in [*running, *idle]:
            handle.close()
        multi.close()
    if failed:
        more = len(failed) - SHOWN_FAILURES
        raise UploadError(f"S3 PUT to {bucket!r} failed for {len(failed)} object(s): "
                          + "; ".join(failed[:SHOWN_FAILURES])
                          + (f"; and {more} more" if more > 0 else ""))


def _handle(signer: S3Credentials, timeout: float) -> pycurl.Curl:
    handle = pycurl.Curl()
    handle.setopt(pycurl.CUSTOMREQUEST, "PUT")
    handle.setopt(pycurl.AWS_SIGV4, f"aws:amz:{signer.region}:s3")
    handle.setopt(pycurl.USERNAME, signer.access_key_id)
    handle.setopt(pycurl.PASSWORD, signer.secret_access_key)
    handle.setopt(pycurl.NOSIGNAL, 1)
    handle.setopt(pycurl.TIMEOUT_MS, int(timeout * 1000))
    return handle


def _prepare(handle: pycurl.Curl, endpoint_url: str, bucket: str, put: _Put) -> None:
    upload = put.upload
    handle.setopt(pycurl.URL, f"{endpoint_url.rstrip('/')}/{bucket}/"
                              f"{quote(upload.key, safe='/-_.~')}")
    headers = [f"{name}: {value}" for name, value in upload.headers.items()]
    headers.append("Expect:")  # the body goes at once, without waiting for 100 Continue
    if not any(name.lower() == "content-type" for name in upload.headers):
        headers.append("Content-Type:")  # none at all, not curl's form encoding
    handle.setopt(pycurl.HTTPHEADER, headers)
    handle.setopt(pycurl.POSTFIELDS, upload.body)
    handle.setopt(pycurl.POSTFIELDSIZE_LARGE, len(upload.body))
    handle.setopt(pycurl.WRITEDATA, put.answer)


def _perform(multi: pycurl.CurlMulti) -> None:
    while multi.perform()[0] == pycurl.E_CALL_MULTI_PERFORM:
        pass
