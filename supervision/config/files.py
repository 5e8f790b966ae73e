"""Reading what the configuration names, without letting the file decide how long it takes.

>>> text = read_config_text(Path("config/production.example.toml"))

A configuration file, and every file a setting names (CA bundles, TLS keys), is read only
when it is a regular file of bounded size: a FIFO would block the reader until someone
writes into it (and a SIGHUP's reload with it), a symlink to ``/dev/zero`` would be read
forever, a device may have side effects. The file is opened non-blocking (opening a FIFO
for reading never waits for a writer) and judged by ``fstat`` of the opened descriptor,
so a file swapped between the check and the read is judged as read.

A TOML file nested deeper than the parser's recursion allows raises ``RecursionError``
inside :mod:`tomllib`; :func:`deep_nesting_key` finds the key on the line that nests
deepest, so the problem still names a key.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

MAX_CONFIG_BYTES = 1024 * 1024  # a configuration file is a few KB; 1 MiB is generous
MAX_NAMED_FILE_BYTES = 16 * 1024 * 1024  # a CA bundle or key file


class UnreadableFile(Exception):
    """The file is not a regular file of bounded size, or cannot be opened; the message
    is one short clause (``"is a FIFO, not a regular file"``)."""


_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISDIR, "a directory"))


def _kind(mode: int) -> str | None:
    """What *mode* is when it is not a regular file, else None."""
    for test, name in _KINDS:
        if test(mode):
            return name
    return None if stat.S_ISREG(mode) else "not a regular file"


def read_bounded(path: str | os.PathLike[str], limit: int) -> bytes:
    """The bytes of *path*, a regular file of at most *limit* bytes; else
    :class:`UnreadableFile`. Never blocks on a FIFO, never reads past *limit*."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except ValueError:  # an embedded NUL
        raise UnreadableFile("the path holds a NUL character") from None
    except OSError as exc:
        raise UnreadableFile(exc.strerror or type(exc).__name__) from None
    try:
        info = os.fstat(fd)
        kind = _kind(info.st_mode)
        if kind is not None:
            raise UnreadableFile(f"is {kind}, not a regular file")
        if info.st_size > limit:
            raise UnreadableFile(f"is {info.st_size} bytes, more than {limit}")
        chunks, total = [], 0
        while True:
            try:
                chunk = os.read(fd, min(65536, limit + 1 - total))
            except OSError as exc:
                raise UnreadableFile(
                    f"cannot read: {exc.strerror or type(exc).__name__}") from None
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:  # it grew after fstat
                raise UnreadableFile(f"is more than {limit} bytes")
        return b"".join(chunks)
    finally:
        os.close(fd)


def regular_file_problem(value: str, limit: int = MAX_NAMED_FILE_BYTES) -> str | None:
    """Why the file a setting names cannot be read safely (a FIFO, a device, too big, a
    NUL in its path), or None. Does not read it."""
    if "\0" in value:
        return "the path holds a NUL character"
    try:
        info = os.stat(value)
    except OSError as exc:
        return f"cannot read {value!r}: {exc.strerror or type(exc).__name__}"
    kind = _kind(info.st_mode)
    if kind is not None:
        return f"{value!r} is {kind}, not a regular file"
    if info.st_size > limit:
        return f"{value!r} is {info.st_size} bytes, more than {limit}"
    return None


def read_config_text(path: Path) -> str:
    """A configuration file's text (UTF-8); :class:`UnreadableFile` with the reason."""
    data = read_bounded(path, MAX_CONFIG_BYTES)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UnreadableFile(f"not UTF-8 text (byte {exc.start})") from None


_HEADER = re.compile(r"^\s*\[\[?\s*([A-Za-z0-9_.\-\" ]+?)\s*\]\]?\s*(?:#.*)?$")
_KEY = re.compile(r"^\s*([A-Za-z0-9_.\-\"]+)\s*=")


def deep_nesting_key(text: str) -> tuple[str, int]:
    """The dotted key (``section.key``; ``?`` where none can be read) and the 1-based line
    of the line with the most opening brackets and braces: where a file too deeply nested
    for the parser nests deepest."""
    lines = text.splitlines() or [""]
    number = max(range(len(lines)), key=lambda i: lines[i].count("[") + lines[i].count("{"))
    section = ""
    for line in lines[:number]:
        header = _HEADER.match(line)
        if header:
            section = header.group(1).replace('"', "").replace(" ", "")
    found = _KEY.match(lines[number])
    key = found.group(1).replace('"', "") if found else "?"
    return (f"{section}.{key}" if section else key), number + 1
