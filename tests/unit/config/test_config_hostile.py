"""Hostile and careless configuration (issue #26): whatever a file holds, loading it ends in
one line per problem naming the key and exit 78 — never a traceback, never a read that
blocks or never ends; URL settings never show their credentials."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from supervision.app.cli import main
from supervision.app.settings import load_config
from supervision.config import redacted
from supervision.config.files import MAX_CONFIG_BYTES
from supervision.errors import ConfigError
from supervision.secrets import Scrubber, redact_url, secrets_in

DSN = "postgresql://app@127.0.0.1:5432/messenger"
ROOT = Path(__file__).resolve().parents[3]

DEEP = "[" * 5000 + "]" * 5000
# (id, the TOML added to a valid file, the key the one problem line must start with)
MALFORMED = [
    ("ipv6-bracket-unclosed", '[media]\nbase_url = "http://[::1"\n', "media.base_url: "),
    ("s3-endpoint-port-out-of-range", '[s3]\nendpoint_url = "http://h:99999"\n',
     "s3.endpoint_url: "),
    ("array-nested-5000-deep", f"[jobs.recording_finalize]\nbatch_size = {DEEP}\n",
     "jobs.recording_finalize.batch_size: "),
    ("duration-as-datetime", "[jobs.recording_finalize]\npolling_interval = "
     "1979-05-27T07:32:00Z\n", "jobs.recording_finalize.polling_interval: "),
    ("duration-as-time", "[supervision]\nshutdown_grace = 07:32:00\n",
     "supervision.shutdown_grace: "),
    ("nul-in-s3-ca-file", '[s3]\nendpoint_url = "https://127.0.0.1:1"\n'
     'ca_file = "/tmp/a\\u0000b"\n', "s3.ca_file: "),
    ("nul-in-kafka-ca-file", '[kafka]\nsecurity_protocol = "SSL"\n'
     'ssl_cafile = "/tmp/a\\u0000b"\n', "kafka.ssl_cafile: "),
    ("listen-bracket-unclosed", '[http]\nlisten = "[::1:9464"\n', "http.listen: "),
    ("tracing-endpoint-not-a-url", '[tracing]\nendpoint = "http://[::1"\n',
     "tracing.endpoint: "),
    ("plain-over-sasl-plaintext-loopback", '[kafka]\nsecurity_protocol = "SASL_PLAINTEXT"\n'
     'sasl_mechanism = "PLAIN"\nsasl_username = "u"\nsasl_password = "p"\n',
     "kafka.sasl_mechanism: PLAIN over SASL_PLAINTEXT"),
    ("remote-postgres-without-verify-full",
     '[postgres]\ndsn = "postgresql://app@db.internal/m?sslmode=require"\n',
     "postgres.dsn: must use sslmode=verify-full for the remote host db.internal"),
    ("huge-array-value", "[outbox_relay]\nbatch_size = [" + "1," * 20000 + "]\n",
     "outbox_relay.batch_size: expected an integer"),
]


def check_config(*paths: Path) -> subprocess.CompletedProcess[str]:
    """``safetynet check-config`` as a real process (a read that blocks would time out)."""
    args = [arg for path in paths for arg in ("-c", str(path))]
    return subprocess.run([sys.executable, "-m", "supervision.app", "check-config", *args],
                          capture_output=True, text=True, check=False, cwd=ROOT, timeout=30,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def base(tmp_path: Path) -> Path:
    path = tmp_path / "base.toml"
    path.write_text(f'[postgres]\ndsn = "{DSN}"\n')
    return path


@pytest.mark.parametrize(("text", "key"), [(t, k) for _, t, k in MALFORMED],
                         ids=[i for i, _, _ in MALFORMED])
def test_a_malformed_value_is_one_exit_78_line_naming_its_key(
        tmp_path: Path, text: str, key: str) -> None:
    """check-config exits 78 with exactly one short line, which starts with the key."""
    bad = tmp_path / "bad.toml"
    bad.write_text(text)
    proc = check_config(base(tmp_path), bad)
    lines = proc.stderr.splitlines()
    assert (proc.returncode, len(lines)) == (78, 1), proc.stderr[-2000:]
    assert lines[0].startswith("config error: " + key), lines[0]
    assert len(lines[0]) < 400


def test_a_fifo_as_config_file_is_refused_at_once(tmp_path: Path) -> None:
    """A FIFO nobody writes into is named and refused; the process does not wait on it."""
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)
    proc = check_config(base(tmp_path), fifo)
    assert proc.returncode == 78
    assert proc.stderr.strip() == (f"config error: {fifo}: cannot read config file: "
                                   "is a FIFO, not a regular file")


def test_a_symlink_to_dev_zero_is_refused_at_once(tmp_path: Path) -> None:
    """A config path that leads to an endless device is refused, not read forever."""
    link = tmp_path / "zero.toml"
    link.symlink_to("/dev/zero")
    proc = check_config(base(tmp_path), link)
    assert proc.returncode == 78
    assert "is a character device, not a regular file" in proc.stderr


def test_a_config_file_past_the_size_bound_is_refused(tmp_path: Path) -> None:
    """A file bigger than MAX_CONFIG_BYTES is refused before it is parsed."""
    big = tmp_path / "big.toml"
    big.write_text("# " + "x" * MAX_CONFIG_BYTES + "\n")
    with pytest.raises(ConfigError) as info:
        load_config([base(tmp_path), big], {})
    (problem,) = info.value.problems
    assert problem.startswith(f"{big}: cannot read config file: is ") and "more than" in problem


def test_a_fifo_named_as_a_ca_bundle_is_refused_without_reading_it(tmp_path: Path) -> None:
    """s3.ca_file and media.ca_file naming a FIFO are refused naming each key."""
    fifo = tmp_path / "ca.pem"
    os.mkfifo(fifo)
    bad = tmp_path / "bad.toml"
    bad.write_text(f'[s3]\nendpoint_url = "https://127.0.0.1:1"\nca_file = "{fifo}"\n'
                   f'[media]\nca_file = "{fifo}"\n')
    proc = check_config(base(tmp_path), bad)
    assert proc.returncode == 78
    assert sorted(line.split(":")[1].strip() for line in proc.stderr.splitlines()) == [
        "media.ca_file", "s3.ca_file"]


def test_a_private_key_readable_by_others_is_refused(tmp_path: Path) -> None:
    """kafka.ssl_keyfile with mode 0644 is refused naming the key and the fix."""
    from tests.tls_terminator import make_pki

    pki = make_pki(tmp_path)
    pki.client_key.chmod(0o644)
    bad = tmp_path / "bad.toml"
    bad.write_text(f'[kafka]\nsecurity_protocol = "SSL"\nssl_certfile = "{pki.client_cert}"\n'
                   f'ssl_keyfile = "{pki.client_key}"\n')
    with pytest.raises(ConfigError) as info:
        load_config([base(tmp_path), bad], {})
    (problem,) = info.value.problems
    assert problem.startswith("kafka.ssl_keyfile: ") and "mode 0644" in problem
    pki.client_key.chmod(0o600)
    assert load_config([base(tmp_path), bad], {}).kafka.ssl_keyfile == str(pki.client_key)


@pytest.mark.parametrize("dsn", [
    "postgresql://app@127.0.0.1/m", "host=/var/run/postgresql dbname=m",
    "postgresql://app@db.internal/m?sslmode=verify-full", "dbname=m",
])
def test_local_or_verified_postgres_is_accepted(tmp_path: Path, dsn: str) -> None:
    """Loopback, Unix sockets and verify-full need nothing more."""
    path = tmp_path / "c.toml"
    path.write_text(f'[postgres]\ndsn = "{dsn}"\n')
    assert load_config([path], {}).postgres.dsn.reveal() == dsn


def test_tracing_endpoint_query_and_userinfo_are_redacted_in_check_config(
        tmp_path: Path) -> None:
    """An ?api_key= of the OTLP endpoint is printed as ***, the rest of the URL stays."""
    bad = tmp_path / "t.toml"
    bad.write_text('[tracing]\nendpoint = "https://otel.example/v1/traces?api_key=s3cr3t-k&x"\n')
    result = CliRunner().invoke(main, ["check-config", "-c", str(base(tmp_path)),
                                       "-c", str(bad)])
    assert result.exit_code == 0, result.output
    assert "s3cr3t-k" not in result.output
    assert 'endpoint = "https://otel.example/v1/traces?api_key=***&x"' in result.output
    cfg = load_config([base(tmp_path), bad], {})
    assert "s3cr3t-k" in secrets_in(cfg)  # so every log line masks it too
    assert redacted(cfg)["tracing"]["endpoint"].endswith("api_key=***&x")


@pytest.mark.parametrize(("url", "shown"), [
    ("https://u:pw@h/p?a=1&b=2#frag", "https://***@h/p?a=***&b=***"),
    ("http://h:1/v1/traces", "http://h:1/v1/traces"),
    ("http://[::1/x?token=abc", "http://[::1/x?***"),
])
def test_redact_url_hides_userinfo_and_query_values(url: str, shown: str) -> None:
    assert redact_url(url) == shown


@pytest.mark.parametrize("text", [
    "GET /v1/traces?api_key=abcd1234 failed", "x-amz-signature=abcd1234ef",
    "X-Amz-Credential=AKIAEXAMPLE/2026", "credential=hunter2222",
    "headers={'Authorization': 'Bearer abcd1234'}", "Authorization: AWS4-HMAC-SHA256 abcd1234",
    "authorization=abcd1234",
])
def test_scrubber_masks_keys_signatures_credentials_and_authorization(text: str) -> None:
    """The scrubber knows key, api_key, signature, credential and authorization."""
    scrubbed = Scrubber().scrub(text)
    assert "abcd1234" not in scrubbed and "hunter2222" not in scrubbed
    assert "AKIAEXAMPLE" not in scrubbed
    assert "***" in scrubbed
