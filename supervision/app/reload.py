"""``SIGHUP``: re-read the TOML files and apply what can change without a restart.

>>> reloaded = reconcile(running_cfg, load_config(paths, os.environ))
>>> reloaded.changed, reloaded.needs_restart
(('jobs.recording_finalize.batch_size', 'logging.level'), ('postgres.dsn',))

What applies: everything the tree is built from — log level and format, intervals, batch
sizes, thresholds, ``enabled`` flags, restart intensity, ``http.listen`` — because a
reload rebuilds the tree (:func:`supervision.runtime.serve_root` stops the old one
gracefully and starts the new one in the same process). What does not: the settings of
the resources opened once around the tree (the PostgreSQL pool, the S3 worker, the Kafka
producer, the media client, the tracer) and the shutdown grace of the running root. A
change there is logged as ``config_reload_needs_restart`` with the keys (never values) and
the running values stay; the rest applies. An invalid file is refused:
``config_reload_refused``, one line per problem (the words of exit 78), and nothing
changes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import attrs
import structlog
import trio

from supervision.config import Config
from supervision.errors import ConfigError
from supervision.logs import configure_logging
from supervision.secrets import secrets_in

log = structlog.get_logger("reload")

# Opened once around the tree: a change needs a restart (key prefixes, dotted).
RESTART_KEYS = ("postgres", "s3", "kafka", "media", "tracing", "supervision.shutdown_grace")


@attrs.frozen
class Reloaded:
    cfg: Config  # the new configuration, the restart-only keys kept at their running values
    changed: tuple[str, ...]  # keys that apply now
    needs_restart: tuple[str, ...]  # keys that changed but keep their running value


def leaves(obj: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Every setting of an attrs tree as (dotted key, value)."""
    for field in attrs.fields(type(obj)):
        value, key = getattr(obj, field.name), f"{prefix}{field.name}"
        if attrs.has(type(value)):
            yield from leaves(value, f"{key}.")
        else:
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
    return Reloaded(applied, tuple(k for k in changed if k not in later), tuple(later))


def reloader(running: Config,
             load: Callable[[], Config]) -> Callable[[], Awaitable[Config | None]]:
    """A SIGHUP handler's logic: load (in a worker thread: it reads files), log, and return
    the configuration to apply now (None when refused or nothing applies)."""
    current = running

    async def reload() -> Config | None:
        nonlocal current
        try:
            new = await trio.to_thread.run_sync(load)
        except ConfigError as exc:
            for problem in exc.problems:
                log.error("config_reload_refused", problem=problem)
            return None
        outcome = reconcile(current, new)
        if outcome.needs_restart:
            log.warning("config_reload_needs_restart", keys=list(outcome.needs_restart))
        if not outcome.changed:
            log.info("config_reload_unchanged")
            return None
        previous, current = current, outcome.cfg
        if any(k.startswith("logging.") for k in outcome.changed):
            configure_logging(current.logging.level, current.logging.format,
                              secrets=secrets_in(previous) | secrets_in(new))
        log.info("config_reloaded", changed=list(outcome.changed))
        return current

    return reload
