"""Bad-input fixtures: a World per case (fresh database, S3 behind a fault proxy, the
media-stack stand-in) and build/bad-input.md rendered after the suite."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import psycopg
import pytest

from supervision.dev.s3 import S3Server
from supervision.tree.health import HEALTH
from tests.badinput.report import DOC, load, render
from tests.badinput.world import World
from tests.chaos.report import write_atomic
from tests.faults import FaultProxy, s3_proxy_fixture
from tests.media_stub import MediaStub, media_stub

__all__ = ["bad_input_doc", "media_stub", "s3_proxy_fixture", "world"]


@pytest.fixture(scope="session", autouse=True)
def bad_input_doc() -> Iterator[None]:
    """After the suite, render build/bad-input.md from the figures the cases wrote (the
    committed docs/bad-input.md changes only by `make bad-input-report`)."""
    yield
    figures = load()
    if figures:  # each xdist worker that ran a case renders; the last one has them all
        write_atomic(DOC, render(figures))


@pytest.fixture
async def world(db_dsn: str, s3_server: S3Server, bucket: str, s3_proxy: FaultProxy,
                media_stub: MediaStub) -> AsyncIterator[World]:
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        try:
            yield World(db_dsn, conn, s3_server, bucket, s3_proxy, media_stub)
        finally:
            HEALTH.clear_fault("s3")
            HEALTH.clear_fault("kafka")
