"""What every verb of the command line shares, the console's included: the configuration
loaded or exit 78, one clear line on failure (secrets masked), the operator's connection.

The verbs live in :mod:`supervision.app.cli` (a module per group of verbs) and
:mod:`supervision.app.console.commands`; both import this module, neither the other.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import click

from supervision.app.settings import Config, load_config
from supervision.config import EXIT_CONFIG, config_paths
from supervision.errors import ConfigError
from supervision.secrets import Scrubber, secrets_in

if TYPE_CHECKING:
    import psycopg

EXIT_INFRA = 1


def load_or_exit(config_files: Sequence[Path]) -> Config:
    """Load the configuration or exit 78 with one line per problem."""
    try:
        return load_config(config_paths(config_files, os.environ), os.environ)
    except ConfigError as exc:
        for problem in exc.problems:
            click.echo(f"config error: {problem}", err=True)
        sys.exit(EXIT_CONFIG)


def fail(message: str, code: int = EXIT_INFRA, cfg: Config | None = None) -> NoReturn:
    """Print one line and exit; with *cfg*, its secrets are masked (the message may quote
    a driver's, which may quote a DSN)."""
    click.echo(f"error: {Scrubber(secrets_in(cfg) if cfg else ()).scrub(message)}", err=True)
    sys.exit(code)


def operator_connection(cfg: Config) -> psycopg.Connection:
    """An operator verb's connection, with the daemon's session settings (its statement
    and lock timeouts, search_path pinned: supervision.db.pgconn) and its client deadline:
    no verb waits on the database for longer than the daemon would."""
    # psycopg loads here, not at import: --help needs no driver
    from supervision.db.pgconn import client_deadline, connect, conninfo

    return connect(conninfo(cfg.postgres, "safetynet-cli"), client_deadline(cfg.postgres))
