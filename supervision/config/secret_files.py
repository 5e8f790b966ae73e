"""Every secret setting may be given as a file: ``<key>_file`` names a file holding it.

>>> raw = {"postgres": {"dsn_file": "/run/secrets/dsn"}}
>>> read_secret_files(Config, raw)         # {"postgres": {"dsn": "<the file's text>"}}

One rule for every setting whose type is :class:`~supervision.secrets.Secret`
(``postgres.dsn``, ``s3.secret_access_key``, ``kafka.sasl_password``, ``media.token``,
``console.password_hash``, … — whatever the root class holds, found by the one walk of
the tree): ``postgres.dsn_file = "/run/secrets/dsn"`` (or
``SAFETYNET__POSTGRES__DSN_FILE``) reads the value from that file — a Kubernetes Secret
volume, systemd's ``LoadCredential=`` (``$CREDENTIALS_DIRECTORY``), a Docker secret. The
file is read when the configuration is loaded, so at start and at every SIGHUP: a rotated
password is taken up by a reload, no restart. Its text is UTF-8, at most
:data:`MAX_SECRET_BYTES`, one trailing newline dropped (what ``echo`` and most secret
stores leave). Both the value and the file given, a file that cannot be read (missing,
not a regular file, too large, not UTF-8) or an empty path: a problem naming the key, and
the load fails (exit 78; a reload is refused).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from supervision.config.files import UnreadableFile, read_bounded
from supervision.config.values import bounded_repr
from supervision.secrets import Secret
from supervision.tree_walk import walk

FILE_SUFFIX = "_file"
MAX_SECRET_BYTES = 64 * 1024  # a DSN, a key, a token, a hash: far below


def secret_keys(root: type[Any]) -> list[str]:
    """The dotted keys of *root*'s secret settings."""
    return [key for key, field, _ in walk(root) if field.type is Secret]


def read_secret_files(root: type[Any], raw: Mapping[str, Any]
                      ) -> tuple[dict[str, Any], list[str]]:
    """*raw* with each ``<secret>_file`` replaced by the secret read from that file (a
    copy: *raw* is not changed), and the problems, one line per key."""
    out = _copy(raw)
    problems: list[str] = []
    for key in secret_keys(root):
        *path, name = key.split(".")
        table: Any = out
        for part in path:
            table = table.get(part) if isinstance(table, dict) else None
        if not isinstance(table, dict) or f"{name}{FILE_SUFFIX}" not in table:
            continue
        given = table.pop(f"{name}{FILE_SUFFIX}")
        if name in table:
            problems.append(f"{key}{FILE_SUFFIX}: {key} is set too; give the secret or "
                            "the file that holds it, not both")
            continue
        try:
            table[name] = _read(given)
        except ValueError as exc:
            problems.append(f"{key}{FILE_SUFFIX}: {exc}")
    return out, problems


def _read(given: Any) -> str:
    if not isinstance(given, str) or not given.strip():
        raise ValueError(f"expected the path of a file, got {bounded_repr(given)}")
    try:
        data = read_bounded(given, MAX_SECRET_BYTES)
    except UnreadableFile as exc:
        raise ValueError(f"cannot read {given!r}: {exc}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{given!r} is not UTF-8 text (byte {exc.start})") from None
    return text.removesuffix("\n").removesuffix("\r")


def _copy(raw: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _copy(v) if isinstance(v, Mapping) else v for k, v in raw.items()}
