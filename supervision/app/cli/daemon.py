"""The daemon's verbs: ``check-config``, ``run`` (the supervised tree until a signal) and
``run-once`` (one cycle of a job, its counts as one JSON line)."""

from __future__ import annotations

import gc
import json
import os
import sys
from functools import partial
from pathlib import Path

import click
import tomli_w

from supervision.app.cli.group import (
    config_option,
    config_problems,
    exit_if_misconfigured,
    job_option,
    main,
)
from supervision.app.settings import load_config
from supervision.app.verbs import fail, load_or_exit
from supervision.config import EXIT_CONFIG, config_paths, redacted
from supervision.errors import ConfigError, SafetynetError, describe
from supervision.jobs import Job
from supervision.secrets import secrets_in


@main.command("check-config")
@config_option
def check_config(config_files: tuple[Path, ...]) -> None:
    """Validate the configuration and print the effective values, secrets redacted."""
    cfg = load_or_exit(config_files)
    click.echo(tomli_w.dumps(redacted(cfg)), nl=False)


@main.command()
@config_option
def run(config_files: tuple[Path, ...]) -> None:
    """Run the daemon: the whole supervised tree until SIGTERM/SIGINT; SIGHUP re-reads the
    configuration files."""
    cfg = load_or_exit(config_files)
    # the daemon's modules load once the configuration is known good: an invalid file
    # exits 78 without paying their import (a deploy hook's, a crash loop's)
    import trio

    from supervision.app.daemon import run_daemon
    from supervision.logs import configure_logging

    configure_logging(cfg.logging.level, cfg.logging.format, secrets=secrets_in(cfg))
    paths = config_paths(config_files, os.environ)
    # what is imported and loaded by now lives as long as the process: out of the
    # collector's sight, a full collection no longer walks it (~60 ms with the GIL held,
    # a stall of every actor and of the relay's commit-to-ack latency)
    gc.freeze()
    problems: list[str] = []
    code = EXIT_CONFIG
    try:
        code = trio.run(run_daemon, cfg, partial(load_config, paths, dict(os.environ)))
    except* ConfigError as group:  # a file the config names (a CA bundle) cannot be loaded
        problems = config_problems(group)
    exit_if_misconfigured(problems)
    sys.exit(code)


@main.command("run-once")
@job_option("The job to run once.")
@config_option
def run_once(job: Job, config_files: tuple[Path, ...]) -> None:
    """Run one full cycle of JOB, print its counts as one JSON line, exit."""
    cfg = load_or_exit(config_files)
    import psycopg  # after the configuration, as for run
    import trio

    from supervision.app.daemon import run_once as run_one_cycle
    from supervision.logs import configure_logging

    configure_logging(cfg.logging.level, cfg.logging.format, secrets=secrets_in(cfg))
    failure: str | None = None
    counts: dict[str, object] = {}
    problems: list[str] = []
    try:
        counts = trio.run(run_one_cycle, cfg, job)
    except* ConfigError as group:
        problems = config_problems(group)
    except* (SafetynetError, psycopg.Error, OSError, RuntimeError) as group:
        failure = describe(group)
    exit_if_misconfigured(problems)
    if failure is not None:
        fail(failure, cfg=cfg)
    click.echo(json.dumps(counts, sort_keys=False))
