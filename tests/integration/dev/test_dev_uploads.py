"""The dev stack's bulk uploads (supervision.dev.uploads), against SeaweedFS: every object
stored as the recorder would store it, server errors tried again, what still fails
named."""

from __future__ import annotations

import uuid
from functools import partial

import pytest
import trio

from supervision.dev.s3 import S3Server
from supervision.dev.uploads import S3Credentials, Upload, UploadError, object_headers, put_objects
from tests.faults import (
    FaultProxy,
    HttpRule,
    s3_object,
    s3_proxy_fixture,  # noqa: F401
)


def keys(n: int) -> list[str]:
    return [f"call-recordings/{uuid.uuid4()}" for _ in range(n)]


def test_uploads_store_every_object_with_its_body_type_and_metadata(
        s3_server: S3Server, bucket: str) -> None:
    """40 objects over 16 connections, the last one without a Content-Type: each HEADs
    with its length, type and duration metadata; the untyped one is not given curl's form
    encoding."""
    ogg = keys(39)
    untyped = keys(1)[0]
    uploads = [Upload(key, b"OggS" + bytes(n), object_headers("audio/ogg",
                                                              {"duration-seconds": str(n)}))
               for n, key in enumerate(ogg)]
    s3_server.put_objects(bucket, [*uploads, Upload(untyped, b"\x1aE\xdf\xa3")])
    for n, key in enumerate(ogg):
        head = s3_server.head_object(bucket, key)
        assert (head["content-length"], head["content-type"],
                head["x-amz-meta-duration-seconds"]) == (str(4 + n), "audio/ogg", str(n))
    head = s3_server.head_object(bucket, untyped)
    assert head["content-length"] == "4"
    assert "form-urlencoded" not in head.get("content-type", "")
    assert "x-amz-meta-duration-seconds" not in head


async def test_uploads_try_server_errors_again_and_name_what_still_failed(
        s3_server: S3Server, s3_proxy: FaultProxy, bucket: str) -> None:
    """Through a proxy: three 500s are tried again and every object lands; a key answered
    500 every time fails after exactly four tries, a 403 at once, each named in the error,
    while the other objects of the same call are stored."""
    upload = partial(put_objects, s3_proxy.url, s3_server.credentials, bucket)
    first = keys(10)
    flaky = HttpRule(s3_object("PUT"), status=500, times=3)
    s3_proxy.rules.append(flaky)
    await trio.to_thread.run_sync(upload, [Upload(key, b"abc") for key in first])
    assert flaky.hits == 3
    assert all(s3_server.head_object(bucket, key)["content-length"] == "3" for key in first)

    broken, refused, fine = keys(3)
    always = HttpRule(s3_object("PUT", keys={broken}), status=500)
    denied = HttpRule(s3_object("PUT", keys={refused}), status=403)
    s3_proxy.rules[:] = [always, denied]
    with pytest.raises(UploadError) as failed:
        await trio.to_thread.run_sync(
            upload, [Upload(key, b"abc") for key in (broken, refused, fine)])
    assert (always.hits, denied.hits) == (4, 1)
    message = str(failed.value)
    assert "failed for 2 object(s)" in message
    assert f"{broken}: 500" in message and f"{refused}: 403" in message
    assert s3_server.head_object(bucket, fine)["content-length"] == "3"


def test_uploads_with_a_wrong_secret_are_refused_with_the_servers_answer(
        s3_server: S3Server, bucket: str) -> None:
    """The signature is checked by the server: a wrong secret key stores nothing and the
    error carries SeaweedFS's 403 answer."""
    wrong = S3Credentials(s3_server.credentials.access_key_id, "not-the-secret")
    (key,) = keys(1)
    with pytest.raises(UploadError, match=r"403 .*SignatureDoesNotMatch"):
        put_objects(s3_server.endpoint_url, wrong, bucket, [Upload(key, b"abc")])
    with pytest.raises(Exception, match="404"):
        s3_server.head_object(bucket, key)
