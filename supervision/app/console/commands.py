"""``safetynet console`` and ``safetynet history`` (registered on the CLI group)."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path
from typing import Any

import click

from supervision.app.settings import Config
from supervision.app.terminal import printable
from supervision.app.verbs import fail, load_or_exit, operator_connection
from supervision.config import EXIT_CONFIG
from supervision.errors import describe


@click.command()
@click.option("--hash-password", "hash_password", is_flag=True,
              help="Read a password on stdin, print its console.password_hash value, exit.")
@click.option("-c", "--config", "config_files", multiple=True,
              type=click.Path(path_type=Path),
              help="TOML config file; repeat to layer files (later wins). "
              "Default: $SAFETYNET_CONFIG.")
def console(hash_password: bool, config_files: tuple[Path, ...]) -> None:
    """The operator console in the browser, on console.listen (loopback by default):
    read-only unless console.allow_actions; every action is recorded (safetynet history)."""
    if hash_password:
        from supervision.passwords import hash_password as make_hash

        if sys.stdin.isatty():
            import getpass

            password = getpass.getpass("password: ")
        else:
            password = sys.stdin.readline().rstrip("\r\n")
        if not password:
            click.echo("error: an empty password", err=True)
            sys.exit(2)
        click.echo(make_hash(password))
        return
    import trio

    from supervision.config import console_problems, console_warnings
    from supervision.logs import configure_logging
    from supervision.secrets import secrets_in

    cfg = load_or_exit(config_files)
    problems = console_problems(cfg.console)
    if problems:
        for problem in problems:
            click.echo(f"config error: {problem}", err=True)
        sys.exit(EXIT_CONFIG)
    configure_logging(cfg.logging.level, cfg.logging.format, secrets=secrets_in(cfg))
    import structlog

    for warning in console_warnings(cfg.console):
        structlog.get_logger("safetynet.console").warning("console_config_warning",
                                                          problem=warning)
    trio.run(serve_console, cfg)


READ_TIMEOUT_S = 30  # a client silent this long mid-request is disconnected


def hypercorn_config(cfg: Config) -> Any:
    """Hypercorn's settings: the console's address, no logs of its own, a read timeout
    (a slow client cannot hold a connection open forever)."""
    from hypercorn.config import Config as HypercornConfig

    hc = HypercornConfig()
    hc.bind = [cfg.console.listen]
    hc.accesslog = None
    hc.errorlog = None
    hc.graceful_timeout = 2.0
    hc.read_timeout = READ_TIMEOUT_S
    return hc


async def serve_console(cfg: Config, *, signals: bool = True) -> None:
    """Serve the console until SIGINT/SIGTERM (with *signals*) or until cancelled."""
    import structlog
    import trio
    from hypercorn.trio import serve

    from supervision.app.console.app import build_app
    from supervision.db.database import open_database
    from supervision.db.pgconn import client_deadline, conninfo

    hc = hypercorn_config(cfg)
    async with open_database(conninfo(cfg.postgres, "safetynet-console"), size=4,
                             name="safetynet-console",
                             connect_timeout=cfg.postgres.connect_timeout,
                             deadline=client_deadline(cfg.postgres)) as db, \
            trio.open_nursery() as nursery:
        stop = trio.Event()

        async def on_signal() -> None:
            with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for _ in signals:
                    stop.set()
                    return

        if signals:
            nursery.start_soon(on_signal)
        structlog.get_logger("safetynet.console").info(
            "console_started", listen=cfg.console.listen,
            allow_actions=cfg.console.allow_actions, auth=cfg.console.auth)
        await serve(build_app(cfg, db), hc, shutdown_trigger=stop.wait)  # type: ignore[arg-type]
        nursery.cancel_scope.cancel()


@click.command()
@click.option("--json", "as_json", is_flag=True, help="One JSON object per action.")
@click.option("--since", default=None,
              help="Only actions since then: a duration back (24h) or an ISO date/time.")
@click.option("--limit", default=100, show_default=True,
              type=click.IntRange(1, 500),  # trail.HISTORY_PAGE_MAX
              help="Actions to show at most.")
@click.option("-c", "--config", "config_files", multiple=True,
              type=click.Path(path_type=Path),
              help="TOML config file; repeat to layer files (later wins). "
              "Default: $SAFETYNET_CONFIG.")
def history(as_json: bool, since: str | None, limit: int,
            config_files: tuple[Path, ...]) -> None:
    """The operator trail, newest first: who did what, from where (cli or console), to
    which ids, why, and the result."""
    import psycopg  # the driver loads with the verbs that reach the database, not for --help

    from supervision.app.trail import history as read_history
    from supervision.app.trail import parse_since

    try:
        when = None if since is None else parse_since(since)
    except (ValueError, OverflowError):  # OverflowError: 1000000d is before the year 1
        raise click.BadParameter("a duration (24h) or an ISO date/time after the year 1",
                                 param_hint="--since") from None
    cfg = load_or_exit(config_files)
    try:
        with operator_connection(cfg) as conn:
            actions = read_history(conn, since=when, limit=limit)
    except psycopg.Error as exc:
        fail(f"postgres: {describe(exc)}", cfg=cfg)
    for action in actions:
        if as_json:
            click.echo(json.dumps(action.as_json(), default=str))
            continue
        ids = " ".join(action.ids[:10]) + (f" (+{len(action.ids) - 10})"
                                           if len(action.ids) > 10 else "")
        click.echo(printable(
            f"#{action.id} {action.at.isoformat()} {action.actor} ({action.origin}"
            f"{' ' + action.client if action.client else ''}) {action.verb} {ids}"
            f"{' — ' + action.reason if action.reason else ''} "
            f"{json.dumps(action.result, default=str)}"))
    if not as_json:
        click.echo(f"{len(actions)} action(s)", err=True)
