"""The config package's shared pieces: the one walker, the leased-job block, the one
certificate-file policy, and cattrs' errors as one line per problem."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

import attrs
import pytest

from supervision.app.reload import leaves
from supervision.app.settings import Config, config_from_dict
from supervision.config import (
    LeasedJob,
    PostgresConfig,
    lock_ttl_setting,
    max_run_duration_setting,
    polling_interval_setting,
    redacted,
    settings_reference,
    walk,
)
from supervision.config import config_from_dict as generic_config_from_dict
from supervision.config.checks import leased_jobs
from supervision.config.fields import setting
from supervision.errors import ConfigError
from supervision.secrets import secrets_in

DSN = "postgresql://app:walk-pw@127.0.0.1:5432/messenger"
ROOT = Path(__file__).resolve().parents[3]


def problems(raw: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigError) as info:
        config_from_dict({"postgres": {"dsn": DSN}, **raw})
    return info.value.problems


def flat(tree: dict[str, Any], prefix: str = "") -> list[str]:
    """The dotted keys of a nested dict, in order."""
    keys: list[str] = []
    for key, value in tree.items():
        keys.extend(flat(value, f"{prefix}{key}.") if isinstance(value, dict)
                    else [f"{prefix}{key}"])
    return keys


def test_one_walk_gives_the_same_keys_to_reference_redaction_and_reload() -> None:
    """The class (defaults) and a loaded configuration walk to the same dotted keys, once
    each, and the reference, check-config's print and a reload's leaves all list them."""
    cfg = config_from_dict({"postgres": {"dsn": DSN}})
    from_class = [key for key, _, _ in walk(Config)]
    from_instance = [key for key, _, _ in walk(cfg)]
    assert from_class == from_instance and len(set(from_class)) == len(from_class)
    assert from_class[0] == "postgres.dsn" and "jobs.conference_reaper.lock_ttl" in from_class
    assert [row.key for row in settings_reference(Config)] == from_class
    assert flat(redacted(cfg)) == from_class
    assert [key for key, _ in leaves(cfg)] == from_class
    assert dict(leaves(cfg))["jobs.conference_reaper.lock_ttl"] == 120.0


def test_secrets_are_found_through_the_walk() -> None:
    """secrets_in reads every setting of the tree: the DSN's password, an S3 key and a
    tracing endpoint's query value."""
    cfg = config_from_dict({"postgres": {"dsn": DSN},
                            "s3": {"access_key_id": "AKIAWALK", "secret_access_key": "sk-walk"},
                            "tracing": {"endpoint": "https://otel/v1?api_key=tr-walk"}})
    found = secrets_in(cfg)
    assert {"walk-pw", "AKIAWALK", "sk-walk", "tr-walk"} <= found


def test_both_lease_run_jobs_share_the_leased_block() -> None:
    """recording_finalize and conference_reaper are the leased jobs; their block's three
    settings carry one doc each, whatever the job."""
    cfg = config_from_dict({"postgres": {"dsn": DSN}})
    assert [key for key, _ in leased_jobs(cfg)] == ["jobs.recording_finalize",
                                                    "jobs.conference_reaper"]
    for name in ("polling_interval", "lock_ttl", "max_run_duration"):
        docs = {row.doc for row in settings_reference(Config)
                if row.key in (f"jobs.recording_finalize.{name}", f"jobs.conference_reaper.{name}")}
        assert len(docs) == 1, name
    assert all(isinstance(job, LeasedJob) for _, job in leased_jobs(cfg))


@pytest.mark.parametrize("job", ["recording_finalize", "conference_reaper"])
def test_every_leased_job_refuses_a_lock_ttl_not_above_its_max_run_duration(job: str) -> None:
    """The lease must outlive the longest cycle, for each job that runs under a lease."""
    assert problems({"jobs": {job: {"lock_ttl": "40s", "max_run_duration": "40s"}}}) == [
        f"jobs.{job}.lock_ttl: must be greater than max_run_duration (40s), got 40s"]


@pytest.mark.parametrize(("section", "key"), [
    ("s3", "ca_file"), ("media", "ca_file"), ("kafka", "ssl_cafile"),
    ("kafka", "ssl_certfile"), ("kafka", "ssl_keyfile"),
])
def test_every_certificate_file_is_checked_when_the_configuration_is_loaded(
        tmp_path: Path, section: str, key: str) -> None:
    """A certificate file setting naming a directory is refused at load, one line naming
    the key and the path, whichever section it belongs to."""
    extra = {"s3": {"endpoint_url": "https://127.0.0.1:1"},
             "kafka": {"security_protocol": "SSL"}}.get(section, {})
    (problem,) = problems({section: {**extra, key: str(tmp_path)}})
    assert problem.startswith(f"{section}.{key}: ") and str(tmp_path) in problem


def test_a_section_that_is_not_a_table_is_one_line() -> None:
    """[s3] written as a number is named as the section, with the type it got."""
    assert problems({"s3": 5}) == ["s3: expected a table, got integer"]


def test_unknown_keys_come_before_the_settings_of_their_section() -> None:
    """Within a section the unknown keys are listed first (as written), then each bad
    setting in declaration order, every one at once."""
    assert problems({"s3": {"timeout": "x1", "zz": 1, "buket": "b", "concurrency": 0}}) == [
        "s3.zz: unknown key",
        "s3.buket: unknown key (did you mean 'bucket'?)",
        "s3.timeout: malformed duration 'x1' (use e.g. \"90s\", \"2m\", \"1h30m\", \"250ms\")",
        "s3.concurrency: must be > 0, got 0",
    ]


def test_a_missing_section_still_names_its_required_setting() -> None:
    """Without a [postgres] table the required DSN is named, not the table."""
    with pytest.raises(ConfigError) as info:
        config_from_dict({})
    assert info.value.problems == ["postgres.dsn: required, not set"]


LOADED_BY_CONFIG = """
import sys
from supervision.app.settings import config_from_dict
config_from_dict({"postgres": {"dsn": "postgresql://app@127.0.0.1/messenger"}})
print("\\n".join(sorted(sys.modules)))
"""


def test_loading_the_configuration_imports_no_actor_and_no_kafka_client() -> None:
    """The configuration is loaded and checked (exit 78) before any actor starts: building
    it imports the jobs' settings modules only, never the relay, aiokafka or trio."""
    run = subprocess.run([sys.executable, "-c", LOADED_BY_CONFIG], capture_output=True,
                         text=True, check=True, cwd=ROOT)
    loaded = set(run.stdout.split())
    assert {"actors.finalize.settings", "actors.outbox.settings"} <= loaded
    assert not loaded & {"aiokafka", "trio", "actors.outbox.relay", "actors.finalize.cycle"}
    actors = {m for m in loaded if m.startswith("actors.")}
    assert all(m.count(".") == 1 or m.endswith(".settings") for m in actors), actors


@attrs.frozen
class _Nightly(LeasedJob):
    polling_interval: float = polling_interval_setting(60.0)
    lock_ttl: float = lock_ttl_setting(30.0)
    max_run_duration: float = max_run_duration_setting(10.0)
    window: float = setting(60.0, "How far back.", duration=True)
    removed_keys: ClassVar[Mapping[str, str]] = {"depth": "removed: use window"}

    def problems(self, key: str) -> Iterator[str]:
        if self.window < self.polling_interval:
            yield f"{key}.window: must be >= polling_interval"


@attrs.frozen
class _Batch:
    nightly: _Nightly = attrs.field(factory=_Nightly)


@attrs.frozen
class _Root:
    postgres: PostgresConfig
    batch: _Batch = attrs.field(factory=_Batch)


def test_the_generic_checks_find_a_new_jobs_rules_by_walking_the_tree() -> None:
    """A root the framework has never seen: its leased job, however deep, gets the lease
    rule and the PostgreSQL timeouts below its TTL, and its own rules run under its key."""
    with pytest.raises(ConfigError) as info:
        generic_config_from_dict(_Root, {
            "postgres": {"dsn": DSN, "statement_timeout": "30s"},
            "batch": {"nightly": {"max_run_duration": "30s", "window": "1s"}}})
    assert info.value.problems == [
        "batch.nightly.lock_ttl: must be greater than max_run_duration (30s), got 30s",
        "postgres.statement_timeout: must be below batch.nightly.lock_ttl (30s), got 30s",
        "batch.nightly.window: must be >= polling_interval",
    ]
    assert [key for key, _ in leased_jobs(generic_config_from_dict(
        _Root, {"postgres": {"dsn": DSN}}))] == ["batch.nightly"]


def test_a_removed_key_is_refused_with_the_hint_of_the_section_that_lost_it() -> None:
    """A section names the keys it once had: one of them is refused with its hint, not as
    an unknown key; the same name in another section is only unknown."""
    with pytest.raises(ConfigError) as info:
        generic_config_from_dict(_Root, {"postgres": {"dsn": DSN, "depth": 1},
                                         "batch": {"nightly": {"depth": 3}}})
    assert info.value.problems == ["postgres.depth: unknown key",
                                   "batch.nightly.depth: removed: use window"]
