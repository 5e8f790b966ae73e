"""The ``safetynet`` command group and what its verbs share: the options every verb
takes the same way, and the exit codes."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from supervision.config import EXIT_CONFIG
from supervision.errors import ConfigError, leaves
from supervision.jobs import Job

JOBS = tuple(job.value for job in Job)  # click matches an Enum by name: offer the values
EXIT_SLO = 2  # status: an SLO is violated; requeue: an unknown id

_F = TypeVar("_F", bound=Callable[..., Any])


def job_option(help_text: str) -> Callable[[_F], _F]:
    """``--job``: one of :class:`~supervision.jobs.Job`'s names, passed on as the member."""
    return click.option("--job", required=True, type=click.Choice(JOBS), help=help_text,
                        callback=lambda _ctx, _param, value: Job(value))


def config_option(func: _F) -> _F:
    return click.option(
        "-c", "--config", "config_files", multiple=True, type=click.Path(path_type=Path),
        help="TOML config file; repeat to layer files (later wins). "
        "Default: $SAFETYNET_CONFIG.",
    )(func)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="safetynet")
def main() -> None:
    """safetynet: drives stuck messenger recordings and conferences to a terminal state."""


def actor_options(func: _F) -> _F:
    """``--reason`` and ``--actor``: recorded in the operator trail (``safetynet history``)."""
    func = click.option("--actor", default=None,
                        help="Who acts, for the trail (default: the OS user).")(func)
    return click.option("--reason", default=None,
                        help="Why: recorded in the trail (and shown by status).")(func)


def config_problems(group: BaseExceptionGroup[ConfigError]) -> list[str]:
    return [p for exc in leaves(group) if isinstance(exc, ConfigError) for p in exc.problems]


def exit_if_misconfigured(problems: list[str]) -> None:
    """Exit 78 with one line per problem, as for an invalid config file."""
    if problems:
        for problem in problems:
            click.echo(f"config error: {problem}", err=True)
        sys.exit(EXIT_CONFIG)
