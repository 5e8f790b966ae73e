"""How HEAD answers are classified (SPEC §3 and issue #13's canary rules); no servers."""

from __future__ import annotations

import pytest

from actors.s3.objectstore import (
    HEALTHY,
    Fault,
    Missing,
    classify_canary,
    classify_object,
)


def test_canary_key_answering_404_is_healthy() -> None:
    """The must-not-exist key is missing: the object path answers truthfully."""
    assert classify_canary(404, {"content-type": "application/xml"}) == HEALTHY


def test_canary_key_answering_200_is_a_configuration_fault() -> None:
    """A key nobody writes answers 200: the endpoint says "found" to anything, so its
    answers cannot tell present from missing."""
    assert classify_canary(200, {"content-length": "0"}) == Fault("canary_key_exists")


@pytest.mark.parametrize("header", ["x-amz-error-code", "x-minio-error-code"])
def test_404_that_says_no_such_bucket_is_a_fault_not_a_missing_object(header: str) -> None:
    """A 404 whose error code is NoSuchBucket is about the bucket, not the object: a
    configuration fault on the canary and on a recording's HEAD alike."""
    headers = {header: "NoSuchBucket"}
    assert classify_canary(404, headers) == Fault("bucket_missing")
    assert classify_object("call-recordings/r1", 404, headers) == Fault("bucket_missing")


def test_plain_404_on_a_recording_is_missing() -> None:
    """Without an error code (SeaweedFS sends none on HEAD), 404 means not uploaded."""
    assert classify_object("call-recordings/r1", 404, {}) == Missing()
    assert classify_object("call-recordings/r1", 404, {"x-amz-error-code": "NoSuchKey"}) == (
        Missing())
