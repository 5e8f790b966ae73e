"""SIGHUP's decision: which changed keys apply now, which wait for a restart."""

from __future__ import annotations

from typing import Any

from supervision.app.reload import reconcile
from supervision.config import config_from_dict

BASE: dict[str, Any] = {"postgres": {"dsn": "postgresql://u:old-pw@db/x"},
                        "logging": {"level": "info"},
                        "jobs": {"recording_finalize": {"batch_size": 10}}}


def config(**over: Any) -> Any:
    raw = {section: dict(values) for section, values in BASE.items()}
    for section, values in over.items():
        raw.setdefault(section, {}).update(values)
    return config_from_dict(raw)


def test_tree_settings_apply_and_are_named() -> None:
    """Log level, batch sizes, intervals and enabled flags apply; the keys are listed."""
    new = config(logging={"level": "debug"},
                 jobs={"recording_finalize": {"batch_size": 20},
                       "conference_reaper": {"enabled": False}})
    out = reconcile(config(), new)
    assert out.changed == ("jobs.recording_finalize.batch_size",
                           "jobs.conference_reaper.enabled", "logging.level")
    assert out.needs_restart == ()
    assert out.cfg == new


def test_resource_settings_keep_their_running_value_and_are_named() -> None:
    """A new DSN (a secret) is reported by key only and the running one stays, while the
    rest of the file applies."""
    running = config()
    out = reconcile(running, config(postgres={"dsn": "postgresql://u:new-pw@db/x"},
                                    logging={"level": "warning"},
                                    supervision={"shutdown_grace": "9s"}))
    assert out.needs_restart == ("postgres.dsn", "supervision.shutdown_grace")
    assert out.changed == ("logging.level",)
    assert out.cfg.postgres == running.postgres
    assert out.cfg.supervision.shutdown_grace == running.supervision.shutdown_grace
    assert out.cfg.logging.level == "warning"
    assert "new-pw" not in repr((out.changed, out.needs_restart))


def test_an_unchanged_file_changes_nothing() -> None:
    """Reloading the same file reports no change."""
    out = reconcile(config(), config())
    assert (out.changed, out.needs_restart) == ((), ())
