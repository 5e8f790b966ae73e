"""TLS client contexts that trust a private CA, loaded once when the daemon starts.

>>> context = verifying_context(cfg.media.ca_file, "media.ca_file")
>>> httpx.AsyncClient(verify=context)

An empty *ca_file* means the public CAs of certifi (what httpx trusts by default), loaded
once per process (:func:`public_context`: a load costs about 20 ms of CPU, and a reaper
cycle, a console page and each test's resources open a client). A
bundle that cannot be read or holds no certificate is a configuration problem: it raises
:class:`~supervision.errors.ConfigError` naming the key, so ``safetynet run`` exits 78
with one line instead of failing every request later. The loader checks the same file with
:func:`ca_bundle_problem` (every certificate file is checked at load,
:mod:`supervision.config.certificates`); reading it again here catches a file replaced
since.
"""

from __future__ import annotations

import functools
import ssl

import certifi

from supervision.errors import ConfigError


def ca_bundle_problem(ca_file: str) -> str | None:
    """Why *ca_file* does not load as a bundle of CA certificates (``cannot load '...':
    no such file``), or None; the loader checks ``media.ca_file`` with it."""
    try:
        ssl.create_default_context(cafile=ca_file)
    except FileNotFoundError:
        problem = "no such file"
    except PermissionError:
        problem = "permission denied"
    except IsADirectoryError:
        problem = "is a directory"
    except (ssl.SSLError, ValueError, UnicodeDecodeError):
        problem = "not a PEM bundle of CA certificates"
    except OSError as exc:
        problem = exc.strerror or type(exc).__name__
    else:
        return None
    return f"cannot load {ca_file!r}: {problem}"


def verifying_context(ca_file: str, key: str) -> ssl.SSLContext:
    """A client context that verifies the peer's chain and host name against *ca_file*
    (read again at each call: a file replaced since is seen), or the shared
    :func:`public_context` when it is empty; *key* names the setting in errors."""
    if not ca_file:
        return public_context()
    if problem := ca_bundle_problem(ca_file):
        raise ConfigError([f"{key}: {problem}"])
    return ssl.create_default_context(cafile=ca_file)


@functools.cache
def public_context() -> ssl.SSLContext:
    """certifi's public CAs, verifying chain and host name: one context per process,
    shared by every client that trusts them. Nothing may change it once made (httpcore
    sets its ALPN list on each connection: the same ``http/1.1`` for all of ours)."""
    return ssl.create_default_context(cafile=certifi.where())
