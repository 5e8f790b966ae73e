"""The ``safetynet`` command line (SPEC §7).

Exit codes: 0 success; 1 infrastructure failure or a child beyond its restart intensity;
2 usage errors, a violated SLO (``status``) or an unknown id (``requeue``); 78 bad
configuration. No verb ends in a traceback: expected failures print one clear line each.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click
import psycopg
import tomli_w

from supervision.config import EXIT_CONFIG, Config, config_paths, load_config, redacted
from supervision.errors import ConfigError, NotYetAvailable, SafetynetError
from supervision.logs import configure_logging
from supervision.tracing import configure_tracing

JOBS = ("recording-finalize", "conference-reaper", "outbox-relay")
ONCE_READY = ("recording-finalize", "outbox-relay")
EXIT_INFRA = 1

_F = TypeVar("_F", bound=Callable[..., Any])


def _config_option(func: _F) -> _F:
    return click.option(
        "-c", "--config", "config_files", multiple=True, type=click.Path(path_type=Path),
        help="TOML config file; repeat to layer files (later wins). "
        "Default: $SAFETYNET_CONFIG.",
    )(func)


def _load(config_files: Sequence[Path]) -> Config:
    """Load the configuration or exit 78 with one line per problem."""
    try:
        return load_config(config_paths(config_files, os.environ), os.environ)
    except ConfigError as exc:
        for problem in exc.problems:
            click.echo(f"config error: {problem}", err=True)
        sys.exit(EXIT_CONFIG)


def _fail(message: str, code: int = EXIT_INFRA) -> NoReturn:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


def _not_yet(verb: str) -> NoReturn:
    _fail(f"'safetynet {verb}': {NotYetAvailable()}", EXIT_INFRA)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="safetynet")
def main() -> None:
    """safetynet: drives stuck messenger recordings and conferences to a terminal state."""


@main.command("check-config")
@_config_option
def check_config(config_files: tuple[Path, ...]) -> None:
    """Validate the configuration and print the effective values, secrets redacted."""
    cfg = _load(config_files)
    click.echo(tomli_w.dumps(redacted(cfg)), nl=False)


@main.command()
@_config_option
def migrate(config_files: tuple[Path, ...]) -> None:
    """Create or update the messenger schema (SPEC §2); re-running is a no-op."""
    from supervision.migrate import migrate as run_migrations

    cfg = _load(config_files)
    try:
        applied = run_migrations(cfg.postgres.dsn.reveal())
    except SafetynetError as exc:
        _fail(str(exc))
    if applied:
        for migration in applied:
            click.echo(f"applied {migration.version:04d}_{migration.name}")
    else:
        click.echo("schema is up to date")


@main.command()
@_config_option
def run(config_files: tuple[Path, ...]) -> None:
    """Run the daemon: the whole supervised tree until SIGTERM/SIGINT."""
    import trio

    from supervision.app import run_daemon

    cfg = _load(config_files)
    configure_logging(cfg.logging.level, cfg.logging.format)
    configure_tracing(cfg.tracing)
    sys.exit(trio.run(run_daemon, cfg))


@main.command("run-once")
@click.option("--job", required=True, type=click.Choice(JOBS), help="The job to run once.")
@_config_option
def run_once(job: str, config_files: tuple[Path, ...]) -> None:
    """Run one full cycle of JOB, print its counts as one JSON line, exit."""
    import trio

    from supervision.app import run_once as run_one_cycle

    cfg = _load(config_files)
    if job not in ONCE_READY:
        _not_yet(f"run-once --job {job}")
    configure_logging(cfg.logging.level, cfg.logging.format)
    failure: str | None = None
    counts: dict[str, object] = {}
    try:
        counts = trio.run(run_one_cycle, cfg, job)
    except* (SafetynetError, psycopg.Error, OSError, RuntimeError) as group:
        failure = _first_error(group)
    if failure is not None:
        _fail(failure)
    click.echo(json.dumps(counts, sort_keys=False))


def _first_error(group: BaseExceptionGroup[BaseException]) -> str:
    exc: BaseException = group
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}"


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@_config_option
def status(as_json: bool, config_files: tuple[Path, ...]) -> None:
    """Backlogs, oldest ages, quarantine and SLO verdicts; exit 2 when an SLO is violated."""
    _load(config_files)
    _not_yet("status")


@main.command()
@click.argument("ids", nargs=-1)
@click.option("--all-quarantined", is_flag=True, help="Re-enqueue every quarantined row.")
@_config_option
def requeue(ids: tuple[str, ...], all_quarantined: bool, config_files: tuple[Path, ...]) -> None:
    """Runbook re-enqueue of finalize rows: Pending, attempts 0, due now."""
    if bool(ids) == all_quarantined:
        raise click.UsageError("give recording finalize ids or --all-quarantined (not both)")
    _load(config_files)
    _not_yet("requeue")


@main.command()
@click.option("--dir", "base_dir", type=click.Path(path_type=Path), default=None,
              help="Where the servers keep their data (default: a fresh temp dir).")
def dev(base_dir: Path | None) -> None:
    """Start PostgreSQL, Tansu and SeaweedFS locally, migrate, and serve until Ctrl-C."""
    from supervision.devrun import run_dev

    sys.exit(run_dev(base_dir))
