"""Configuration loading, validation, overrides and redaction (no servers)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import attrs
import pytest
import tomli_w
from click.testing import CliRunner
from cryptography.hazmat.primitives import serialization

from supervision.app.cli import main
from supervision.app.settings import Config, load_config, reference_markdown
from supervision.config import (
    EXIT_CONFIG,
    SaslMechanism,
    SecurityProtocol,
    SettingDoc,
    redacted,
    settings_reference,
)
from supervision.durations import format_duration, parse_duration
from supervision.errors import ConfigError
from tests.tls_terminator import Pki, make_pki

ROOT = Path(__file__).resolve().parents[3]
DSN = "postgresql://app:s3cr3t-pw@127.0.0.1:5432/messenger"


def write(tmp_path: Path, text: str, name: str = "c.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def problems_of(paths: list[Path], env: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config(paths, env or {})
    return info.value.problems


def base(tmp_path: Path, extra: str = "") -> Path:
    return write(tmp_path, f'[postgres]\ndsn = "{DSN}"\n{extra}', "base.toml")


def test_defaults_match_spec_section_6(tmp_path: Path) -> None:
    """Every default equals the value SPEC §6 lists."""
    cfg = load_config([base(tmp_path)], {})
    rf, cr = cfg.jobs.recording_finalize, cfg.jobs.conference_reaper
    assert (rf.polling_interval, rf.batch_size, rf.max_attempts) == (60, 100, 8)
    assert (rf.finalize_sla_timeout, rf.backoff_base, rf.backoff_cap) == (1800, 60, 900)
    assert (rf.backoff_factor, rf.backoff_jitter, rf.lock_ttl, rf.max_run_duration) == (
        2.0, 0.2, 300, 180)
    assert (cr.polling_interval, cr.empty_room_grace, cr.provision_timeout) == (30, 90, 120)
    assert (cr.stale_live_timeout, cr.lock_ttl, cr.max_run_duration) == (14400, 120, 30)
    assert cfg.s3.key_prefix == "call-recordings/" and cfg.s3.concurrency == 8
    assert cfg.outbox_relay.batch_size == 500 and cfg.outbox_relay.poll_interval == 1
    assert cfg.http.listen == "127.0.0.1:9464"
    assert (cfg.supervision.max_restarts, cfg.supervision.restart_window) == (5, 60)


def test_config_classes_are_frozen(tmp_path: Path) -> None:
    """Loaded config cannot be mutated by an actor."""
    cfg = load_config([base(tmp_path)], {})
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        cfg.jobs.recording_finalize.batch_size = 1  # type: ignore[misc]


def test_later_files_override_earlier_ones(tmp_path: Path) -> None:
    """Files merge key by key in order; the last one to set a key wins."""
    first = base(tmp_path, "[s3]\nbucket = \"a\"\nconcurrency = 3\n")
    second = write(tmp_path, "[s3]\nbucket = \"b\"\n", "second.toml")
    cfg = load_config([first, second], {})
    assert cfg.s3.bucket == "b"
    assert cfg.s3.concurrency == 3


def test_env_overrides_files_with_typed_values(tmp_path: Path) -> None:
    """SAFETYNET__SECTION__KEY beats every file and is parsed by the key's type."""
    env = {
        "SAFETYNET__S3__BUCKET": "from-env",
        "SAFETYNET__S3__CONCURRENCY": "16",
        "SAFETYNET__JOBS__RECORDING_FINALIZE__ENABLED": "false",
        "SAFETYNET__JOBS__RECORDING_FINALIZE__BACKOFF_FACTOR": "3.5",
        "SAFETYNET__JOBS__CONFERENCE_REAPER__EMPTY_ROOM_GRACE": "2m",
        "UNRELATED": "x",
    }
    cfg = load_config([base(tmp_path, "[s3]\nbucket = \"file\"\n")], env)
    assert cfg.s3.bucket == "from-env"
    assert cfg.s3.concurrency == 16
    assert cfg.jobs.recording_finalize.enabled is False
    assert cfg.jobs.recording_finalize.backoff_factor == 3.5
    assert cfg.jobs.conference_reaper.empty_room_grace == 120


def test_dsn_can_come_from_env_alone() -> None:
    """No file at all is fine when the required key is in the environment."""
    cfg = load_config([], {"SAFETYNET__POSTGRES__DSN": DSN})
    assert cfg.postgres.dsn.reveal() == DSN


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90s", 90), ("2m", 120), ("4h", 14400), ("1h30m", 5400), ("250ms", 0.25), ("7d", 604800),
     (45, 45), (1.5, 1.5), ("30", 30)],
)
def test_durations_accept_strings_and_seconds(text: str | int | float, seconds: float) -> None:
    """Durations parse from unit strings or plain seconds and print back the same."""
    assert parse_duration(text) == seconds
    assert parse_duration(format_duration(seconds)) == seconds


def test_unknown_key_suggests_the_closest_name(tmp_path: Path) -> None:
    """A typo names the key and proposes the real one."""
    problems = problems_of([base(tmp_path, "[s3]\nbuket = \"x\"\n")])
    assert problems == ["s3.buket: unknown key (did you mean 'bucket'?)"]


def test_removed_cap_on_missing_verdicts_is_refused_saying_what_replaced_it(
        tmp_path: Path) -> None:
    """max_failed_per_cycle (issue #13) is gone since issue #25: a file that still sets it
    is refused with the reason, not with "unknown key"."""
    problems = problems_of([base(tmp_path, "[jobs.recording_finalize]\n"
                                           "max_failed_per_cycle = 50\n")])
    assert problems == ["jobs.recording_finalize.max_failed_per_cycle: removed: Missing "
                        "verdicts now need evidence instead of a per-cycle cap"
                        " (docs/architecture.md); delete this line"]


def test_unknown_env_key_is_an_error_too(tmp_path: Path) -> None:
    """An override that matches no key is reported, not silently ignored."""
    problems = problems_of([base(tmp_path)], {"SAFETYNET__S3__CONCURENCY": "3"})
    assert problems == ["s3.concurency: unknown key (did you mean 'concurrency'?)"]


def test_wrong_type_names_key_and_types(tmp_path: Path) -> None:
    """A string where an integer belongs is reported with both types."""
    problems = problems_of([base(tmp_path, "[s3]\nconcurrency = \"eight\"\n")])
    assert problems == ["s3.concurrency: expected an integer, got string 'eight'"]


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ("[jobs.recording_finalize]\nbatch_size = 0\n",
         "jobs.recording_finalize.batch_size: must be > 0, got 0"),
        ("[jobs.recording_finalize]\nmax_attempts = -2\n",
         "jobs.recording_finalize.max_attempts: must be > 0, got -2"),
        ("[s3]\nconcurrency = 0\n", "s3.concurrency: must be > 0, got 0"),
        ("[outbox_relay]\nbatch_size = -1\n", "outbox_relay.batch_size: must be > 0, got -1"),
        ("[jobs.conference_reaper]\nempty_room_grace = \"-5s\"\n",
         "jobs.conference_reaper.empty_room_grace: malformed duration '-5s' "
         "(use e.g. \"90s\", \"2m\", \"1h30m\", \"250ms\")"),
        ("[jobs.conference_reaper]\npolling_interval = 0\n",
         "jobs.conference_reaper.polling_interval: must be > 0, got 0s"),
        ("[jobs.recording_finalize]\nredrive_max = -1\n",
         "jobs.recording_finalize.redrive_max: must be >= 0, got -1"),
        ("[jobs.recording_finalize]\nredrive_after = \"8d\"\n",
         "jobs.recording_finalize.redrive_after: must be <= 7d, got 8d"),
    ],
)
def test_negative_and_zero_sizes_are_rejected(tmp_path: Path, extra: str, expected: str) -> None:
    """Sizes and intervals must be positive; the message names the key and the value."""
    assert problems_of([base(tmp_path, extra)]) == [expected]


def test_lock_ttl_must_exceed_max_run_duration(tmp_path: Path) -> None:
    """The seeds require the lock TTL to outlive the longest cycle."""
    extra = "[jobs.recording_finalize]\nlock_ttl = \"3m\"\nmax_run_duration = \"3m\"\n"
    assert problems_of([base(tmp_path, extra)]) == [
        "jobs.recording_finalize.lock_ttl: must be greater than max_run_duration (3m), got 3m"
    ]


def test_malformed_duration_is_reported(tmp_path: Path) -> None:
    """A duration with an unknown unit names the key and shows how to write it."""
    problems = problems_of([base(tmp_path, "[s3]\ntimeout = \"5 parsecs\"\n")])
    assert len(problems) == 1
    assert problems[0].startswith("s3.timeout: malformed duration '5 parsecs'")


def test_missing_dsn_is_reported(tmp_path: Path) -> None:
    """postgres.dsn is required."""
    assert problems_of([write(tmp_path, "[s3]\nbucket = \"x\"\n")]) == [
        "postgres.dsn: required, not set"
    ]


def test_empty_dsn_is_reported(tmp_path: Path) -> None:
    """An empty DSN is as bad as a missing one."""
    problems = problems_of([write(tmp_path, '[postgres]\ndsn = ""\n')])
    assert problems == [
        "postgres.dsn: must be set (a libpq connection string, e.g. postgresql://user@host/db)"
    ]


def test_unreadable_file_is_reported(tmp_path: Path) -> None:
    """A file that cannot be read is named with the reason."""
    missing = tmp_path / "nope.toml"
    assert problems_of([missing]) == [
        f"{missing}: cannot read config file: No such file or directory"
    ]


def test_invalid_toml_reports_line_and_column(tmp_path: Path) -> None:
    """A TOML syntax error says where it is."""
    bad = write(tmp_path, "[postgres]\ndsn = \"x\"\n[s3\n")
    (problem,) = problems_of([bad])
    assert re.search(r"invalid TOML: .*\(at line 3, column \d+\)", problem), problem


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    """Validation does not stop at the first problem: one line each."""
    text = '[s3]\nconcurrency = 0\nbuket = "x"\n[http]\nlisten = "nowhere"\n'
    problems = problems_of([write(tmp_path, text)])
    assert sorted(problems) == sorted([
        "http.listen: must be HOST:PORT, got 'nowhere'",
        "postgres.dsn: required, not set",
        "s3.buket: unknown key (did you mean 'bucket'?)",
        "s3.concurrency: must be > 0, got 0",
    ])


def test_secrets_never_appear_in_repr_or_redacted_output(tmp_path: Path) -> None:
    """DSN password, S3 keys and the media token are masked everywhere config is shown."""
    extra = ('[s3]\naccess_key_id = "AKIAEXAMPLEKEY"\nsecret_access_key = "very-secret-key"\n'
             '[media]\ntoken = "media-bearer-token"\n')
    cfg = load_config([base(tmp_path, extra)], {})
    shown = repr(cfg) + str(redacted(cfg)) + f"{cfg.s3.secret_access_key}"
    for secret in ("s3cr3t-pw", "AKIAEXAMPLEKEY", "very-secret-key", "media-bearer-token"):
        assert secret not in shown
    assert redacted(cfg)["postgres"]["dsn"] == (
        "user=app password=*** dbname=messenger host=127.0.0.1 port=5432")
    assert cfg.media.token.reveal() == "media-bearer-token"


@pytest.mark.parametrize(("dsn", "secrets"), [
    ("host=db user=app password = hunter22x dbname=m sslmode=verify-full", ["hunter22x"]),
    ("host=db password='two words here' dbname=m sslmode=verify-full",
     ["two words here", "words"]),
    ("host=db sslpassword=keyphrase1 sslmode=verify-full", ["keyphrase1"]),
    ("postgresql://app@db/m?password=qu3ry-pw&sslpassword=k3y-pw&sslmode=verify-full",
     ["qu3ry-pw", "k3y-pw"]),
    ("postgresql://app:pct%25pw@db/m?sslmode=verify-full", ["pct%pw", "pct%25pw"]),
])
def test_dsn_redaction_masks_every_credential_libpq_reads(
        tmp_path: Path, dsn: str, secrets: list[str]) -> None:
    """check-config masks what libpq would take as a credential, however it is written:
    spaces around '=', quoted values with spaces, sslpassword, URL query parameters."""
    path = write(tmp_path, tomli_w.dumps({"postgres": {"dsn": dsn}}))
    result = CliRunner().invoke(main, ["check-config", "-c", str(path)])
    assert result.exit_code == 0, result.output
    assert "password=***" in result.output
    for secret in secrets:
        assert secret not in result.output


@pytest.mark.parametrize("verb", ["check-config", "run", "run-once", "migrate", "status"])
def test_unescaped_percent_in_a_url_dsn_exits_78_without_quoting_it(
        tmp_path: Path, verb: str) -> None:
    """psycopg's own message for a bad '%' quotes the password (and psycopg_pool logs it
    on every retry); every verb refuses the DSN with a message of its own, before any
    driver sees it."""
    path = write(tmp_path, '[postgres]\ndsn = "postgresql://app:pa%zzw0rd@127.0.0.1:9/m"\n')
    args = ["--job", "outbox-relay"] if verb == "run-once" else []
    proc = subprocess.run(  # a real process: before the fix, `run` would keep retrying
        [sys.executable, "-m", "supervision.app", verb, *args, "-c", str(path)],
        capture_output=True, text=True, check=False, cwd=ROOT, timeout=60,
        env={"PATH": "/usr/bin:/bin"})
    assert proc.returncode == EXIT_CONFIG, proc.stderr
    assert proc.stderr.splitlines() == [
        "config error: postgres.dsn: has a '%' not followed by two hex digits (in a URL, "
        "write a literal '%' as %25)"]
    assert "zzw0rd" not in proc.stdout + proc.stderr


def test_check_config_prints_effective_config_redacted(tmp_path: Path) -> None:
    """check-config exits 0 and prints merged values with secrets masked."""
    path = base(tmp_path, '[media]\ntoken = "media-bearer-token"\n')
    result = CliRunner().invoke(main, ["check-config", "-c", str(path)],
                                env={"SAFETYNET__S3__CONCURRENCY": "4"})
    assert result.exit_code == 0, result.output
    assert "concurrency = 4" in result.output
    assert 'dsn = "user=app password=*** dbname=messenger host=127.0.0.1 port=5432"' in (
        result.output)
    assert "s3cr3t-pw" not in result.output and "media-bearer-token" not in result.output


def test_config_file_from_safetynet_config_env(tmp_path: Path) -> None:
    """SAFETYNET_CONFIG names the file when -c is absent."""
    path = base(tmp_path, '[s3]\nbucket = "env-named"\n')
    result = CliRunner().invoke(main, ["check-config"], env={"SAFETYNET_CONFIG": str(path)})
    assert result.exit_code == 0, result.output
    assert 'bucket = "env-named"' in result.output


def test_invalid_config_exits_78_with_one_line_per_problem(tmp_path: Path) -> None:
    """The real process exits with EX_CONFIG and no traceback."""
    path = write(tmp_path, "[jobs.recording_finalize]\nbatch_size = 0\n")
    proc = subprocess.run(
        [sys.executable, "-m", "supervision.app", "check-config", "-c", str(path)],
        capture_output=True, text=True, check=False, cwd=ROOT, env={"PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == EXIT_CONFIG == 78
    assert proc.stderr.splitlines() == [
        "config error: postgres.dsn: required, not set",
        "config error: jobs.recording_finalize.batch_size: must be > 0, got 0",
    ]


def test_example_files_load_and_production_example_lists_every_key(tmp_path: Path) -> None:
    """The demo settings and config/*.toml are valid, and the production example
    documents every setting (its secrets come from the environment)."""
    env = {"SAFETYNET__POSTGRES__DSN": DSN}
    load_config([ROOT / "supervision" / "dev" / "demo.toml"], env)
    load_config([ROOT / "config" / "production.example.toml"],
                {**env, "SAFETYNET__KAFKA__SASL_PASSWORD": "pw"})
    text = (ROOT / "config" / "production.example.toml").read_text()
    for row in settings_reference(Config):
        section, key = row.key.rsplit(".", 1)
        block = text.split(f"[{section}]\n", 1)[1].split("\n[", 1)[0]
        assert re.search(rf"^# .+\n{key} = ", block, re.MULTILINE), row.key


def test_configuration_reference_matches_config_classes() -> None:
    """docs/configuration.md's reference table is generated from the classes and cannot
    drift."""
    readme = (ROOT / "docs" / "configuration.md").read_text()
    start, end = "<!-- config-reference:start -->\n", "\n<!-- config-reference:end -->"
    assert readme.split(start, 1)[1].split(end, 1)[0] == reference_markdown(), (
        "regenerate with: python -m supervision.app.config_reference")


SPEC_KEYS = [
    "postgres.dsn", "kafka.bootstrap_servers", "kafka.client_id", "s3.endpoint_url", "s3.region",
    "s3.bucket", "s3.key_prefix", "s3.access_key_id", "s3.secret_access_key", "s3.timeout",
    "s3.concurrency", "media.base_url", "media.token", "media.timeout",
    "jobs.recording_finalize.enabled", "jobs.recording_finalize.polling_interval",
    "jobs.recording_finalize.batch_size", "jobs.recording_finalize.max_attempts",
    "jobs.recording_finalize.finalize_sla_timeout", "jobs.recording_finalize.backoff_base",
    "jobs.recording_finalize.backoff_factor", "jobs.recording_finalize.backoff_cap",
    "jobs.recording_finalize.backoff_jitter", "jobs.recording_finalize.lock_ttl",
    "jobs.recording_finalize.max_run_duration", "jobs.conference_reaper.enabled",
    "jobs.conference_reaper.polling_interval", "jobs.conference_reaper.batch_size",
    "jobs.conference_reaper.empty_room_grace", "jobs.conference_reaper.provision_timeout",
    "jobs.conference_reaper.stale_live_timeout", "jobs.conference_reaper.lock_ttl",
    "jobs.conference_reaper.max_run_duration", "outbox_relay.enabled", "outbox_relay.batch_size",
    "outbox_relay.poll_interval", "http.listen", "logging.level", "logging.format",
    "supervision.max_restarts", "supervision.restart_window", "supervision.shutdown_grace",
]


def test_every_spec_key_is_a_setting() -> None:
    """Each key SPEC §6 names exists, spelled exactly."""
    keys = {row.key for row in settings_reference(Config)}
    assert set(SPEC_KEYS) <= keys, set(SPEC_KEYS) - keys


NUMERIC_SETTINGS = [row for row in settings_reference(Config) if row.type in ("int", "float",
                                                                         "duration")]


def test_every_numeric_setting_has_a_maximum() -> None:
    """No number is unbounded: each numeric key names its largest accepted value."""
    assert NUMERIC_SETTINGS
    assert [row.key for row in NUMERIC_SETTINGS if not row.maximum] == []


def _past(maximum: str, kind: str) -> str:
    """A TOML value just past *maximum* (as the reference spells it)."""
    if kind == "duration":
        return f"{parse_duration(maximum.strip(chr(34))) + 1}"
    if kind == "int":
        return str(int(maximum) + 1)
    return str(float(maximum) + 0.05)


@pytest.mark.parametrize("row", NUMERIC_SETTINGS, ids=lambda row: row.key)
def test_value_past_its_maximum_is_refused_naming_the_key(tmp_path: Path, row: object) -> None:
    """One line per problem, naming the key, the maximum and the value given."""
    assert isinstance(row, SettingDoc)
    section, key = row.key.rsplit(".", 1)
    header = "" if section == "postgres" else f"[{section}]\n"  # base() opens [postgres]
    extra = f"{header}{key} = {_past(row.maximum, row.type)}\n"
    problems = problems_of([base(tmp_path, extra)])
    assert len(problems) == 1
    assert problems[0].startswith(f"{row.key}: must be <= "), problems


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ("[s3]\nconcurrency = 2000\n", "s3.concurrency: must be <= 256, got 2000"),
        ("[jobs.recording_finalize]\nbackoff_factor = 1e300\n",
         "jobs.recording_finalize.backoff_factor: must be <= 10.0, got 1e+300"),
        ("[jobs.recording_finalize]\nbackoff_factor = inf\n",
         "jobs.recording_finalize.backoff_factor: must be <= 10.0, got inf"),
        ("[jobs.recording_finalize]\nbackoff_factor = nan\n",
         "jobs.recording_finalize.backoff_factor: must be >= 1, got nan"),
        ("[s3]\ntimeout = inf\n", "s3.timeout: must be <= 5m, got inf"),
        ("[jobs.conference_reaper]\npolling_interval = \"9999d\"\n",
         "jobs.conference_reaper.polling_interval: must be <= 1h, got 9999d"),
        ("[outbox_relay]\nbatch_size = 9223372036854775807\n",
         "outbox_relay.batch_size: must be <= 10000, got 9223372036854775807"),
    ],
)
def test_huge_and_non_finite_numbers_are_refused(tmp_path: Path, extra: str,
                                                 expected: str) -> None:
    """Overflow-sized, infinite and NaN values never reach the jobs."""
    assert problems_of([base(tmp_path, extra)]) == [expected]


def test_value_past_its_maximum_exits_78_from_the_environment(tmp_path: Path) -> None:
    """An env override past the maximum fails like a file value: exit 78, one line."""
    result = CliRunner().invoke(
        main, ["check-config", "-c", str(base(tmp_path))],
        env={"SAFETYNET__JOBS__RECORDING_FINALIZE__MAX_ATTEMPTS": "100000"})
    assert result.exit_code == EXIT_CONFIG
    assert result.stderr.splitlines() == [
        "config error: jobs.recording_finalize.max_attempts: must be <= 100, got 100000"]


# --------------------------------------------------------------------------- kafka security


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def kafka_problems(tmp_path: Path, **kafka: str) -> list[str]:
    return problems_of([base(tmp_path, tomli_w.dumps({"kafka": kafka}))])


def test_kafka_security_settings_load_as_enums_with_the_password_secret(
        tmp_path: Path, pki: Pki) -> None:
    """Protocol and mechanism are enums (any case), the password a Secret that
    check-config masks and the environment can carry."""
    extra = tomli_w.dumps({"kafka": {"security_protocol": "sasl_ssl",
                                     "sasl_mechanism": "scram-sha-256",
                                     "sasl_username": "relay", "ssl_cafile": str(pki.ca)}})
    env = {"SAFETYNET__KAFKA__SASL_PASSWORD": "kafka-sasl-pw"}
    cfg = load_config([base(tmp_path, extra)], env)
    assert cfg.kafka.security_protocol is SecurityProtocol.SASL_SSL
    assert cfg.kafka.sasl_mechanism is SaslMechanism.SCRAM_SHA_256
    assert cfg.kafka.sasl_password.reveal() == "kafka-sasl-pw"
    assert "kafka-sasl-pw" not in repr(cfg) + str(redacted(cfg))
    assert redacted(cfg)["kafka"]["sasl_password"] == "***"
    result = CliRunner().invoke(main, ["check-config", "-c", str(base(tmp_path, extra))],
                                env=env)
    assert result.exit_code == 0, result.output
    assert 'security_protocol = "SASL_SSL"' in result.output
    assert 'sasl_password = "***"' in result.output and "kafka-sasl-pw" not in result.output


@pytest.mark.parametrize(("kafka", "expected"), [
    ({"security_protocol": "TLS"}, ["kafka.security_protocol: must be one of PLAINTEXT, SSL, "
                                    "SASL_PLAINTEXT, SASL_SSL; got 'TLS'"]),
    ({"security_protocol": "SASL_SSL", "sasl_mechanism": "GSSAPI", "sasl_username": "u",
      "sasl_password": "p"},
     ["kafka.sasl_mechanism: must be one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512; "
      "got 'GSSAPI'"]),
    ({"security_protocol": "SASL_SSL"},
     ["kafka.sasl_username: required when security_protocol is SASL_SSL",
      "kafka.sasl_password: required when security_protocol is SASL_SSL"]),
    ({"security_protocol": "SASL_PLAINTEXT", "sasl_username": "u"},
     ["kafka.sasl_password: required when security_protocol is SASL_PLAINTEXT"]),
    ({"sasl_username": "u", "sasl_password": "p"},
     ["kafka.sasl_username: set, but security_protocol PLAINTEXT does not authenticate "
      "(use SASL_SSL or SASL_PLAINTEXT)",
      "kafka.sasl_password: set, but security_protocol PLAINTEXT does not authenticate "
      "(use SASL_SSL or SASL_PLAINTEXT)"]),
    ({"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN", "sasl_username": "u",
      "sasl_password": "p", "bootstrap_servers": "127.0.0.1:9092,kafka-2.internal:9092"},
     ["kafka.sasl_mechanism: PLAIN over SASL_PLAINTEXT would send the password in clear; "
      "use SASL_SSL or SCRAM"]),
    ({"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN", "sasl_username": "u",
      "sasl_password": "p", "bootstrap_servers": "127.0.0.1:9092"},
     ["kafka.sasl_mechanism: PLAIN over SASL_PLAINTEXT would send the password in clear; "
      "use SASL_SSL or SCRAM"]),
    ({"security_protocol": "SSL", "ssl_cafile": "/nonexistent/ca.pem"},
     ["kafka.ssl_cafile: no such file: '/nonexistent/ca.pem'"]),
])
def test_kafka_security_problems_are_one_line_each(
        tmp_path: Path, kafka: dict[str, str], expected: list[str]) -> None:
    assert kafka_problems(tmp_path, **kafka) == expected


def test_tls_files_are_refused_unless_the_protocol_uses_tls(tmp_path: Path, pki: Pki) -> None:
    assert kafka_problems(tmp_path, security_protocol="SASL_PLAINTEXT", sasl_username="u",
                          sasl_password="p", ssl_cafile=str(pki.ca)) == [
        "kafka.ssl_cafile: set, but security_protocol SASL_PLAINTEXT does not use TLS "
        "(use SSL or SASL_SSL)"]


@pytest.mark.parametrize(("files", "expected"), [
    ({"ssl_certfile": "client_cert"},
     "kafka.ssl_keyfile: required with ssl_certfile (mutual TLS needs both)"),
    ({"ssl_keyfile": "client_key"},
     "kafka.ssl_certfile: required with ssl_keyfile (mutual TLS needs both)"),
    ({"ssl_cafile": "client_key"},
     "kafka.ssl_cafile: holds no usable CA certificate (no certificate or crl found)"),
    ({"ssl_certfile": "client_cert", "ssl_keyfile": "server"},
     "kafka.ssl_certfile: with ssl_keyfile, not a usable certificate and key "
     "(key values mismatch)"),
    ({"ssl_certfile": "client_cert", "ssl_keyfile": "encrypted_key"},
     "kafka.ssl_keyfile: the key is encrypted; give an unencrypted key"),
])
def test_tls_files_that_do_not_hold_what_they_should_are_refused(
        tmp_path: Path, pki: Pki, files: dict[str, str], expected: str) -> None:
    """Checked by loading them as the producer will (never prompting for a passphrase)."""
    encrypted = tmp_path / "encrypted.key"
    key = serialization.load_pem_private_key(pki.client_key.read_bytes(), None)
    encrypted.write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"passphrase")))
    encrypted.chmod(0o600)
    paths = {**attrs.asdict(pki), "encrypted_key": encrypted}
    kafka = {key: str(paths[name]) for key, name in files.items()}
    assert kafka_problems(tmp_path, security_protocol="SSL", **kafka) == [expected]
@pytest.mark.parametrize("host", ["media.internal", "10.0.0.7", "[fd00::7]"])
def test_media_token_over_plain_http_to_a_remote_host_is_refused(tmp_path: Path,
                                                                 host: str) -> None:
    """A bearer token may not cross the network in clear text: with media.token set, an
    http:// base_url is refused unless its host is loopback, in one line naming the keys."""
    path = base(tmp_path, f'[media]\nbase_url = "http://{host}:8090"\ntoken = "tok-123"\n')
    (problem,) = problems_of([path])
    assert problem.startswith("media.base_url: must be https:// when media.token is set")
    assert "tok-123" not in problem


@pytest.mark.parametrize(("url", "token"), [
    ("http://127.0.0.1:8090", "tok-123"), ("http://localhost:8090", "tok-123"),
    ("http://[::1]:8090", "tok-123"), ("https://media.internal", "tok-123"),
    ("http://media.internal:8090", ""),
])
def test_media_token_is_allowed_over_https_or_to_loopback(tmp_path: Path, url: str,
                                                          token: str) -> None:
    """https://, a loopback host, or no token at all: nothing to refuse."""
    path = base(tmp_path, f'[media]\nbase_url = "{url}"\ntoken = "{token}"\n')
    assert load_config([path], {}).media.base_url == url


@pytest.mark.parametrize("command", [["check-config"], ["run"],
                                     ["run-once", "--job", "conference-reaper"]])
def test_media_ca_file_that_cannot_be_loaded_exits_78_naming_the_key(
        tmp_path: Path, command: list[str]) -> None:
    """A media.ca_file that is missing or not PEM is refused when the configuration is
    loaded, like every certificate file: exit 78 and one line naming the key, before the
    daemon connects to anything (not a crash loop of failing requests)."""
    bogus = write(tmp_path, "not a certificate\n", "bogus.pem")
    for ca_file, why in ((tmp_path / "absent.pem", "no such file"),
                         (bogus, "not a PEM bundle of CA certificates")):
        path = base(tmp_path, f'[media]\nbase_url = "https://media.internal"\n'
                              f'ca_file = "{ca_file}"\n')
        proc = subprocess.run(
            [sys.executable, "-m", "supervision.app", *command, "-c", str(path)],
            capture_output=True, text=True, check=False, cwd=ROOT, timeout=60,
            env={"PATH": "/usr/bin:/bin"})
        assert proc.returncode == EXIT_CONFIG, proc.stderr
        assert proc.stderr.splitlines() == [
            f"config error: media.ca_file: cannot load '{ca_file}': {why}"]
