"""TLS client contexts that trust a private CA, loaded once when the daemon starts.

>>> context = verifying_context(cfg.media.ca_file, "media.ca_file")
>>> httpx.AsyncClient(verify=context)

An empty *ca_file* means the public CAs of certifi (what httpx trusts by default). A
bundle that cannot be read or holds no certificate is a configuration problem: it raises
:class:`~supervision.errors.ConfigError` naming the key, so ``safetynet run`` exits 78
with one line instead of failing every request later. The loader checks the same file with
:func:`ca_bundle_problem` (every certificate file is checked at load,
:mod:`supervision.config.certificates`); reading it again here catches a file replaced
since.
"""

from __future__ import annotations

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
    (or certifi's bundle when it is empty); *key* names the setting in errors."""
    problem = ca_bundle_problem(ca_file) if ca_file else None
    if problem:
        raise ConfigError([f"{key}: {problem}"])
    return ssl.create_default_context(cafile=ca_file or certifi.where())
