"""structlog set-up: JSON lines by default, a console renderer for ``safetynet dev``.

Every line carries ``timestamp``, ``level`` and ``event``; actors bind ``actor`` and, for
the length of a cycle, ``job_run_id`` (via :mod:`structlog.contextvars`, which follows
Trio tasks because Trio gives each task its own context copy).

One writer (:class:`LineWriter`): structlog's lines and the standard library's go through
the same lock, each JSON line written whole with its newline.

No line shows a secret: every line, the drivers' included (psycopg_pool logs its connect
error on every retry, and libpq's messages may quote a DSN), passes a
:class:`~supervision.secrets.Scrubber` after its exception is formatted.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Iterable
from typing import Any, TextIO

import structlog

from supervision.secrets import Scrubber


class LineWriter:
    """The one writer of log lines: structlog's printer and the standard library's handler
    both write through it, each line (with its newline) in one ``write`` followed by a
    flush, under one lock, so lines from threads and from both logging paths never
    interleave (two writers with two locks merged lines now and then)."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._lock = threading.Lock()

    def write(self, text: str) -> int:
        with self._lock:
            written = self._stream.write(text)
            self._stream.flush()
        return written

    def flush(self) -> None:  # each write flushed already
        return None

    def isatty(self) -> bool:
        return self._stream.isatty()


_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
           "error": logging.ERROR}


def configure_logging(level: str = "info", fmt: str = "json", stream: TextIO | None = None,
                      secrets: Iterable[str] = ()) -> None:
    """Route every structlog logger — and the standard library's loggers of the drivers
    (psycopg's pool, aiokafka, httpx) — to *stream* (stderr by default) in *fmt*, with
    *secrets* (see :func:`~supervision.secrets.secrets_in`) and credential-shaped text
    masked."""
    scrub = Scrubber(secrets)
    renderer: Any
    if fmt == "console":
        renderer = structlog.dev.ConsoleRenderer(colors=(stream or sys.stderr).isatty())
    else:
        renderer = structlog.processors.JSONRenderer()
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    writer = LineWriter(stream or sys.stderr)
    handler = logging.StreamHandler(writer)
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[*shared, structlog.stdlib.add_logger_name],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                    structlog.processors.format_exc_info, scrub, renderer],
    ))
    printer = structlog.WriteLogger(writer)  # type: ignore[arg-type]  # one write per line
    root = logging.getLogger()
    root.handlers = [handler]
    # drivers are chatty below WARNING; their warnings and errors are worth a line
    root.setLevel(max(_LEVELS[level], logging.WARNING))
    structlog.configure(
        processors=[
            *shared,
            structlog.processors.format_exc_info,
            scrub,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        # one printer for every logger (a factory building one per call looked its
        # file's lock up each time: the proxies build a logger per log call)
        logger_factory=lambda *_: printer,
        cache_logger_on_first_use=False,
    )
