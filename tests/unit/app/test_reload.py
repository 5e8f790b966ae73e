"""SIGHUP's decision: which changed keys apply now, which resources are reopened, which
keys wait for a restart, and what is refused before anything is closed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import certifi
import pytest

from supervision.app.reload import reconcile
from supervision.app.resources import Resource, check_before_reopen
from supervision.app.settings import config_from_dict
from supervision.errors import ConfigError

BASE: dict[str, Any] = {"postgres": {"dsn": "postgresql://u:old-pw@db/x?sslmode=verify-full"},
                        "logging": {"level": "info"},
                        "jobs": {"recording_finalize": {"batch_size": 10}}}


def config(**over: Any) -> Any:
    raw = {section: dict(values) for section, values in BASE.items()}
    for section, values in over.items():
        raw.setdefault(section, {}).update(values)
    return config_from_dict(raw)


def test_tree_settings_apply_and_are_named() -> None:
    """Log level, batch sizes, intervals and enabled flags apply; the keys are listed and
    no resource is reopened."""
    new = config(logging={"level": "debug"},
                 jobs={"recording_finalize": {"batch_size": 20},
                       "conference_reaper": {"enabled": False}})
    out = reconcile(config(), new)
    assert out.changed == ("jobs.recording_finalize.batch_size",
                           "jobs.conference_reaper.enabled", "logging.level")
    assert out.needs_restart == () and out.reopened == ()
    assert out.cfg == new


def test_resource_settings_apply_and_reopen_only_their_resource() -> None:
    """A new DSN (a secret) and an S3 bucket apply: the pool and the S3 client are
    reopened, the Kafka producer, media client and tracer are not; the DSN is named by
    key only."""
    new = config(postgres={"dsn": "postgresql://u:new-pw@db/x?sslmode=verify-full"},
                 s3={"bucket": "b2"}, logging={"level": "warning"})
    out = reconcile(config(), new)
    assert out.changed == ("postgres.dsn", "s3.bucket", "logging.level")
    assert out.reopened == (Resource.POSTGRES, Resource.S3)
    assert out.needs_restart == () and out.cfg == new
    assert "new-pw" not in repr((out.changed, out.reopened))


def test_the_shutdown_grace_keeps_its_running_value_and_is_named() -> None:
    """supervision.shutdown_grace belongs to the running root: it waits for a restart,
    while the rest of the file applies."""
    running = config()
    out = reconcile(running, config(supervision={"shutdown_grace": "9s"},
                                    kafka={"client_id": "other"}))
    assert out.needs_restart == ("supervision.shutdown_grace",)
    assert out.changed == ("kafka.client_id",) and out.reopened == (Resource.KAFKA,)
    assert out.cfg.supervision.shutdown_grace == running.supervision.shutdown_grace
    assert out.cfg.kafka.client_id == "other"


def test_an_unchanged_file_changes_nothing() -> None:
    """Reloading the same file reports no change."""
    out = reconcile(config(), config())
    assert (out.changed, out.needs_restart, out.reopened) == ((), (), ())


def test_a_media_ca_file_that_does_not_load_is_refused_when_loaded(tmp_path: Path) -> None:
    """A changed media.ca_file that holds no certificate refuses the reload at load, with
    the words of exit 78, before anything is reopened; a good bundle is checked again
    before the media client is reopened."""
    bad = tmp_path / "ca.pem"
    bad.write_text("not a certificate")
    with pytest.raises(ConfigError) as refused:
        config(media={"ca_file": str(bad)})
    assert refused.value.problems == [f"media.ca_file: cannot load {str(bad)!r}: "
                                      "not a PEM bundle of CA certificates"]
    good = tmp_path / "good.pem"
    good.write_text(Path(certifi.where()).read_text())
    new = config(media={"ca_file": str(good)})
    assert reconcile(config(), new).reopened == (Resource.MEDIA,)
    check_before_reopen(new, (Resource.MEDIA,))
