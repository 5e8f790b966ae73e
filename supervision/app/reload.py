"""``SIGHUP``: re-read the TOML files and apply what changed without a restart.

>>> reloaded = reconcile(running_cfg, load_config(paths, os.environ))
>>> reloaded.changed, reloaded.reopened, reloaded.needs_restart
(('jobs.recording_finalize.batch_size', 's3.bucket'), (<Resource.S3: 's3'>,), ())

What applies: everything the tree is built from — log level and format, intervals, batch
sizes, thresholds, ``enabled`` flags, restart intensity, ``http.listen`` — because a
reload rebuilds the tree (:func:`supervision.tree.runtime.serve_root` stops the old one
gracefully and starts the new one in the same process); and the settings of the
resources shared by the tree (``[postgres]``, ``[s3]``, ``[kafka]``, ``[media]``,
``[tracing]``): between the two trees, only the resources whose section changed are
closed and opened anew (:mod:`supervision.app.resources`) — an ``[s3]`` change starts a
new S3 worker process and leaves the PostgreSQL pool's connections alone. Only
``supervision.shutdown_grace`` (the running root's own) needs a restart: a change is
logged as ``config_reload_needs_restart`` with the key and the running value stays.
``config_reloaded`` names the ``changed`` keys and the ``reopened`` resources, never a
value.

Refused, with ``config_reload_refused``, one line per problem (the words of exit 78), and
nothing changes (old settings, old connections): an invalid file, and what opening a
changed resource would refuse and can be checked without connecting — a certificate file
that does not load (``media.ca_file``, ``s3.ca_file``, Kafka's TLS files: all checked with
the file, :mod:`supervision.config.certificates`; the media bundle is read once more
before its client is reopened). A
server the new settings cannot reach (a new DSN with a wrong host or password, another
broker) is not refused: the new settings apply and the daemon behaves as when that
server is down at start — back-off, ``/readyz`` 503, no exit — until it is reachable or a
corrected file is reloaded. The settings stay the new ones: rolling back to the old
would hide the operator's mistake behind a daemon that looks healthy on a configuration
its file no longer says.

Whatever the loader raises refuses the reload with one line naming the key (an unclosed
IPv6 bracket in a URL, arrays nested past the parser's recursion, a TOML datetime for a
duration, a NUL in a file name), and only regular files of bounded size are read
(:mod:`supervision.config.files`: a FIFO or a symlink to ``/dev/zero`` is refused at
once, never waited on). A new ``http.listen`` is bound before the old tree is stopped
and handed to the new exporter; when it cannot be bound (the port is taken) the reload
is refused and the old tree serves on.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import attrs
import structlog
import trio

from actors.metrics_exporter import prebind
from supervision.app.resources import Resource, changed_resources, check_before_reopen
from supervision.app.settings import Config
from supervision.config import walk
from supervision.config.values import guarded_problem
from supervision.errors import ConfigError
from supervision.logs import configure_logging
from supervision.secrets import secrets_in

log = structlog.get_logger("reload")

# Read once by the running root: a change needs a restart (key prefixes, dotted).
RESTART_KEYS = ("supervision.shutdown_grace",)


@attrs.frozen
class Reloaded:
    cfg: Config  # the new configuration, the restart-only keys kept at their running values
    changed: tuple[str, ...]  # keys that apply now
    needs_restart: tuple[str, ...]  # keys that changed but keep their running value
    reopened: tuple[Resource, ...]  # resources closed and opened anew for the change


def leaves(cfg: Config) -> Iterator[tuple[str, Any]]:
    """Every setting of *cfg* as (dotted key, value)."""
    for key, _, value in walk(cfg):
        yield key, value


def _needs_restart(key: str) -> bool:
    return any(key == p or key.startswith(f"{p}.") for p in RESTART_KEYS)


def _with_value(obj: Any, path: list[str], value: Any) -> Any:
    if len(path) == 1:
        return attrs.evolve(obj, **{path[0]: value})
    inner = _with_value(getattr(obj, path[0]), path[1:], value)
    return attrs.evolve(obj, **{path[0]: inner})


def reconcile(running: Config, new: Config) -> Reloaded:
    """What a reload from *running* to *new* applies, and what it leaves for a restart."""
    old_values = dict(leaves(running))
    changed = [key for key, value in leaves(new) if old_values[key] != value]
    applied, later = new, []
    for key in changed:
        if _needs_restart(key):
            later.append(key)
            applied = _with_value(applied, key.split("."), old_values[key])
    return Reloaded(applied, tuple(k for k in changed if k not in later), tuple(later),
                    changed_resources(running, applied))


async def _bind_new_listen(listen: str) -> None:
    """Bind the new ``http.listen`` while the old tree still serves the old one (the new
    exporter takes the sockets); a ConfigError when it cannot be bound."""
    try:
        await prebind(listen)
    except OSError as exc:
        raise ConfigError([f"http.listen: cannot bind {listen}: "
                           f"{exc.strerror or type(exc).__name__}"]) from None


def reloader(running: Config,
             load: Callable[[], Config]) -> Callable[[], Awaitable[Config | None]]:
    """A SIGHUP handler's logic: load and check (in a worker thread: it reads files), log,
    and return the configuration to apply now (None when refused or nothing applies)."""
    current = running

    async def reload() -> Config | None:
        nonlocal current
        base = current

        def load_and_check() -> Reloaded:
            outcome = reconcile(base, load())
            check_before_reopen(outcome.cfg, outcome.reopened)
            return outcome

        problems: list[str] = []
        try:
            # abandoned (not waited for) when a SIGTERM cancels the reload
            outcome = await trio.to_thread.run_sync(load_and_check, abandon_on_cancel=True)
            if "http.listen" in outcome.changed:
                await _bind_new_listen(outcome.cfg.http.listen)
        except ConfigError as exc:
            problems = exc.problems
        except Exception as exc:
            problems = [guarded_problem("configuration", exc)]
        if problems:
            for problem in problems:
                log.error("config_reload_refused", problem=problem)
            return None
        if outcome.needs_restart:
            log.warning("config_reload_needs_restart", keys=list(outcome.needs_restart))
        if not outcome.changed:
            log.info("config_reload_unchanged")
            return None
        previous, current = current, outcome.cfg
        secrets = secrets_in(previous) | secrets_in(current)  # a new password is masked too
        if any(k.startswith("logging.") for k in outcome.changed) or \
                secrets != secrets_in(previous):
            configure_logging(current.logging.level, current.logging.format, secrets=secrets)
        log.info("config_reloaded", changed=list(outcome.changed),
                 reopened=list(outcome.reopened))
        return current

    return reload
