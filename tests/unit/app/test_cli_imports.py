"""The command line and the daemon import only what the verb and the configuration use.

Each test runs a fresh interpreter (``sys.modules`` of this one has everything loaded) and
lists which of the heavy packages a start loaded: the suite starts ~430 CLI processes and
an operator's ``pause`` or a deploy hook's ``check-config`` pays each import in CPU.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[3]
HEAVY = ("psycopg", "structlog", "rich", "pygments", "aiokafka", "opentelemetry.sdk",
         "botocore", "trio", "httpx", "supervision.app.daemon")


def _loaded(body: str, tmp_path: Path) -> list[str]:
    """Run *body* in a fresh interpreter; the :data:`HEAVY` packages it left loaded."""
    probe = (f"import sys\n{body}\n"
             f"import json\nprint(json.dumps(sorted({{h for h in {HEAVY!r} for m in sys.modules"
             " if m == h or m.startswith(h + '.')})))")
    out = subprocess.run([sys.executable, "-P", "-s", "-c", probe], capture_output=True,
                         text=True, cwd=tmp_path, env={"PATH": "/usr/bin:/bin"}, timeout=60)
    assert out.returncode == 0, out.stderr
    loaded: list[str] = json.loads(out.stdout.strip().splitlines()[-1])
    return loaded


def _invoke(args: list[str], exit_code: int) -> str:
    return ("from click.testing import CliRunner\n"
            "from supervision.app.cli import main\n"
            f"result = CliRunner().invoke(main, {args!r})\n"
            f"assert result.exit_code == {exit_code}, (result.exit_code, result.output)\n")


@pytest.mark.parametrize("args", [["--help"], ["pause", "--help"], ["plan", "--help"],
                                  ["run", "--help"], ["console", "--help"]])
def test_help_loads_no_driver_logging_or_daemon_module(args: list[str], tmp_path: Path) -> None:
    """``--help`` of the group and of a verb loads neither psycopg, structlog (and the
    rich it pulls in), aiokafka, botocore, the OpenTelemetry SDK, Trio nor the daemon."""
    assert _loaded(_invoke(args, 0), tmp_path) == []


@pytest.mark.parametrize("verb", ["check-config", "run", "run-once --job outbox-relay",
                                  "plan --job recording-finalize", "migrate"])
def test_an_unreadable_config_exits_78_before_the_verb_loads_its_machinery(
        verb: str, tmp_path: Path) -> None:
    """A file that is not TOML exits 78 before psycopg, the daemon's modules or structlog
    load: a crash-looping unit or a deploy hook pays the CLI's start only."""
    bad = tmp_path / "bad.toml"
    bad.write_text("bad = [\n")
    assert _loaded(_invoke([*verb.split(), "-c", str(bad)], 78), tmp_path) == []


def test_the_daemon_without_tracing_or_s3_keys_chain_loads_no_sdk_nor_botocore(
        tmp_path: Path) -> None:
    """The daemon's modules, and S3 credentials from static keys, load neither the
    OpenTelemetry SDK (tracing off) nor botocore (no credential chain to ask); the
    drivers the daemon does use are loaded (the probe sees them)."""
    body = ("import supervision.app.daemon\n"
            "from actors.s3.credentials import CredentialSource\n"
            "from supervision.config import S3Config, TracingConfig\n"
            "from supervision.secrets import Secret\n"
            "from actors.tracing import configure_tracing\n"
            "assert configure_tracing(TracingConfig()) is None\n"
            "keys = S3Config(access_key_id=Secret('AKID'), secret_access_key=Secret('s'))\n"
            "source = CredentialSource(keys)\n"
            "assert source.current().access_key_id.reveal() == 'AKID'\n"
            "assert not source.refreshable\n")
    loaded = _loaded(body, tmp_path)
    assert "botocore" not in loaded and "opentelemetry.sdk" not in loaded
    assert {"psycopg", "aiokafka", "trio", "supervision.app.daemon"} <= set(loaded)


def test_tracing_on_and_the_credential_chain_do_load_their_libraries(tmp_path: Path) -> None:
    """With an endpoint the SDK loads, and without static keys botocore's chain is asked:
    what the daemon skips above it still gets when the configuration asks for it."""
    body = ("from actors.s3.credentials import resolve_chain\n"
            "from supervision.config import S3Config, TracingConfig\n"
            "from actors.tracing import configure_tracing\n"
            "provider = configure_tracing(TracingConfig(endpoint='http://127.0.0.1:9/v1/traces'))\n"
            "assert provider is not None\n"
            "provider.shutdown()\n"
            "import os; os.environ['AWS_EC2_METADATA_DISABLED'] = 'true'\n"
            "os.environ['AWS_SHARED_CREDENTIALS_FILE'] = os.devnull\n"
            "os.environ['AWS_CONFIG_FILE'] = os.devnull\n"
            "assert resolve_chain(S3Config()) is None\n")
    loaded = _loaded(body, tmp_path)
    assert {"opentelemetry.sdk", "botocore"} <= set(loaded)


def test_check_config_of_a_plaintext_kafka_config_loads_no_kafka_client(tmp_path: Path) -> None:
    """check-config parses the DSN with psycopg, but builds no Kafka TLS context for a
    PLAINTEXT cluster, so aiokafka stays unloaded (as do the daemon's modules)."""
    body = ("import os\n"
            "os.environ['SAFETYNET__POSTGRES__DSN'] = 'postgresql://u:p@localhost/x'\n"
            "os.environ['SAFETYNET__KAFKA__SECURITY_PROTOCOL'] = 'PLAINTEXT'\n"
            + _invoke(["check-config"], 0))
    assert _loaded(body, tmp_path) == ["psycopg"]


@pytest.mark.parametrize("verb", ["status", "pause --job recording-finalize",
                                  "resume --job recording-finalize", "history"])
def test_operator_verbs_load_the_driver_but_not_the_daemons_runtime(
        verb: str, tmp_path: Path) -> None:
    """``status``, ``pause``, ``resume`` and ``history`` are one connection's work: with
    the server unreachable they fail (exit 1) having loaded psycopg only, not Trio,
    structlog nor the pool (``status`` once loaded all three to name a job pause)."""
    body = ("import os\n"
            "os.environ['SAFETYNET__POSTGRES__DSN'] = 'postgresql://u@127.0.0.1:9/x'\n"
            "os.environ['SAFETYNET__POSTGRES__CONNECT_TIMEOUT'] = '1s'\n"
            + _invoke(verb.split(), 1))
    assert _loaded(body, tmp_path) == ["psycopg"]
