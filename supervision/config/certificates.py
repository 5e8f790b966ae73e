"""The one policy for the certificate files a setting names.

>>> ca_bundle_problem("/etc/ssl/private-ca.pem")  # None: it loads

``s3.ca_file``, ``kafka.ssl_cafile``, ``kafka.ssl_certfile``, ``kafka.ssl_keyfile`` and
``media.ca_file`` are all checked when the configuration is loaded (``check-config``,
start, a SIGHUP's reload), never first when a connection is opened: each must be a
regular file of bounded size (a FIFO or a device is refused without being read,
:func:`~supervision.config.files.regular_file_problem`), readable, and hold what it
should — CA bundles load as PEM certificates, a client certificate loads together with
its key (never prompting for a passphrase), and a private key is refused when its group
or others may read or write it. Each problem is one line naming the key; the words of
each line are those the tests and docs/bad-input.md pin.
"""

from __future__ import annotations

import os
import ssl
import stat
from pathlib import Path
from typing import Any

from supervision.config.files import regular_file_problem
from supervision.config.values import bounded_repr
from supervision.tls import ca_bundle_problem


class NoPassphrase(Exception):
    """The private key is encrypted; no passphrase is configured."""


def no_passphrase() -> str:
    """The passphrase callback of a key load: without one OpenSSL would prompt on the
    terminal for an encrypted key."""
    raise NoPassphrase


def ssl_reason(exc: BaseException) -> str:
    """OpenSSL's words without the library tag and source line: ``key values mismatch``."""
    text = str(exc)
    while text.startswith("[") and "] " in text:  # "[Errno 1] [SSL: TAG] words"
        text = text.split("] ", 1)[1]
    return text.split(" (_ssl.c", 1)[0]


def ca_file(value: Any) -> str | None:
    """``s3.ca_file``: a regular file holding at least one PEM certificate."""
    if not value:
        return None
    unsafe = regular_file_problem(value)
    if unsafe:
        return unsafe
    try:
        ssl.create_default_context(cafile=value)
    except ssl.SSLError:  # an OSError too: first
        return f"{bounded_repr(value)} holds no PEM certificate"
    except OSError as exc:
        return f"cannot read {bounded_repr(value)}: {exc.strerror or type(exc).__name__}"
    return None


def media_ca_file(value: Any) -> str | None:
    """``media.ca_file``: a regular file that loads as a bundle of CA certificates."""
    if not value:
        return None
    if "\0" in value or os.path.lexists(value):
        unsafe = regular_file_problem(value)
        if unsafe:
            return unsafe
    return ca_bundle_problem(value)


def readable_file(value: Any) -> str | None:
    """The Kafka TLS files: a readable regular file (what it holds: :func:`kafka_tls`)."""
    if not value:
        return None
    if "\0" in value:
        return "the path holds a NUL character"
    path = Path(value)
    if not path.is_file():
        return f"no such file: {bounded_repr(value)}"
    if not os.access(path, os.R_OK):
        return f"file is not readable: {bounded_repr(value)}"
    return regular_file_problem(value)


def key_file_problem(value: Any) -> str | None:
    """Why a private key file's permissions are refused (group or others may read or
    write it: the key is the client's identity), or None."""
    if not value:
        return None
    try:
        mode = os.stat(value).st_mode
    except (OSError, ValueError):
        return None  # the readable-file check names what is wrong with the path
    if stat.S_IMODE(mode) & 0o077:
        return (f"{bounded_repr(value)} is readable or writable by its group or others "
                f"(mode {stat.S_IMODE(mode):04o}); chmod 600 it")
    return None
