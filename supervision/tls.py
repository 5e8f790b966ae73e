"""TLS client contexts that trust a private CA, loaded once when the daemon starts.

>>> context = verifying_context(cfg.media.ca_file, "media.ca_file")
>>> httpx.AsyncClient(verify=context)

An empty *ca_file* means the public CAs of certifi (what httpx trusts by default). A
bundle that cannot be read or holds no certificate is a configuration problem: it raises
:class:`~supervision.errors.ConfigError` naming the key, so ``safetynet run`` exits 78
with one line instead of failing every request later. The file is read at start, not by
``check-config``, so a config can be checked on a machine that does not hold the files.
"""

from __future__ import annotations

import ssl

import certifi

from supervision.errors import ConfigError


def verifying_context(ca_file: str, key: str) -> ssl.SSLContext:
    """A client context that verifies the peer's chain and host name against *ca_file*
    (or certifi's bundle when it is empty); *key* names the setting in errors."""
    try:
        return ssl.create_default_context(cafile=ca_file or certifi.where())
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
    raise ConfigError([f"{key}: cannot load {ca_file!r}: {problem}"])
