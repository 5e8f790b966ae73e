"""One log writer (issue #26): structlog's lines and the standard library's, from many
threads at once, each come out whole with their newline: every line parses as JSON."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator

import pytest
import structlog

from supervision.logs import configure_logging


class ChunkyStream:
    """A stream that takes a write in small pieces and lets other threads run between
    them, as a pipe taking a long line in several writes does."""

    def __init__(self) -> None:
        self.parts: list[str] = []

    def write(self, text: str) -> int:
        for start in range(0, len(text), 64):
            self.parts.append(text[start:start + 64])
            time.sleep(0)
        return len(text)

    def flush(self) -> None:
        return None

    def isatty(self) -> bool:
        return False


@pytest.fixture
def chunky() -> Iterator[ChunkyStream]:
    stream = ChunkyStream()
    configure_logging("info", "json", stream=stream)
    yield stream
    configure_logging("info", "json")


def test_lines_from_threads_and_both_logging_paths_are_written_whole(
        chunky: ChunkyStream) -> None:
    """Six threads, half through structlog and half through a driver's stdlib logger,
    300 lines of 1 KB each: every line is one JSON object and none is lost."""
    per_thread, threads = 300, []

    def through_structlog(n: int) -> None:
        log = structlog.get_logger("t")
        for i in range(per_thread):
            log.warning("from_structlog", thread=n, i=i, pad="s" * 1000)

    def through_stdlib(n: int) -> None:
        log = logging.getLogger("aiokafka.fake")
        for i in range(per_thread):
            log.warning("from stdlib %d %d %s", n, i, "x" * 1000)

    for n in range(6):
        threads.append(threading.Thread(target=through_structlog if n % 2 else through_stdlib,
                                        args=(n,)))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    lines = "".join(chunky.parts).splitlines()
    parsed = [json.loads(line) for line in lines]  # a merged line fails here
    assert len(parsed) == 6 * per_thread
    assert sum(e["event"] == "from_structlog" for e in parsed) == 3 * per_thread
