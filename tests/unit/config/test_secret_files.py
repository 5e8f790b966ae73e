"""Every secret setting also accepts a file (issue 36, item 9): ``<key>_file``, one rule for
all of them, both given or an unreadable file a problem naming the key."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import tomli_w

from supervision.app.settings import Config, config_from_dict, load_config
from supervision.config.secret_files import MAX_SECRET_BYTES, read_secret_files, secret_keys
from supervision.errors import ConfigError
from supervision.secrets import Secret
from supervision.tree_walk import walk
from tests.cli import ROOT

DSN = "postgresql://app:s3cr3t-pw@127.0.0.1/messenger"


def secret_file(tmp_path: Path, text: str, name: str = "secret") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_every_secret_setting_is_found_by_the_walk() -> None:
    assert set(secret_keys(Config)) >= {
        "postgres.dsn", "kafka.sasl_password", "s3.access_key_id", "s3.secret_access_key",
        "media.token", "console.password_hash"}
    assert all(field.type is Secret for key, field, _ in walk(Config)
               if key in secret_keys(Config))


@pytest.mark.parametrize("key", secret_keys(Config))
def test_each_secret_is_read_from_its_file_with_one_trailing_newline_dropped(
        key: str, tmp_path: Path) -> None:
    *path, name = key.split(".")
    raw: dict[str, object] = {}
    table = raw
    for part in path:
        table = table.setdefault(part, {})  # type: ignore[assignment]
    table[f"{name}_file"] = str(secret_file(tmp_path, "v a l u e\n\n"))
    out, problems = read_secret_files(Config, raw)
    assert problems == []
    for part in path:
        out = out[part]
    assert out == {name: "v a l u e\n"}
    assert raw != out  # the caller's mapping is left as it was


def test_a_dsn_file_configures_postgres_and_is_masked_like_the_value(tmp_path: Path) -> None:
    cfg = config_from_dict({"postgres": {
        "dsn_file": str(secret_file(tmp_path, DSN + "\r\n"))}})
    assert cfg.postgres.dsn == Secret(DSN)
    env = {"SAFETYNET__POSTGRES__DSN_FILE": str(secret_file(tmp_path, DSN, "env"))}
    assert load_config([], env).postgres.dsn == Secret(DSN)


def test_the_value_and_its_file_together_are_refused_naming_the_key(tmp_path: Path) -> None:
    path = secret_file(tmp_path, "x")
    with pytest.raises(ConfigError) as caught:
        config_from_dict({"postgres": {"dsn": DSN},
                                  "s3": {"secret_access_key": "a",
                                         "secret_access_key_file": str(path)}})
    assert caught.value.problems == [
        "s3.secret_access_key_file: s3.secret_access_key is set too; give the secret or "
        "the file that holds it, not both"]


@pytest.mark.parametrize(("make", "says"), [
    (lambda d: str(d / "missing"), "No such file or directory"),
    (lambda d: str(d), "is a directory, not a regular file"),
    (lambda d: (os.mkfifo(d / "fifo"), str(d / "fifo"))[1], "is a FIFO"),
    (lambda d: str(secret_file(d, "x" * (MAX_SECRET_BYTES + 1))), "more than"),
    (lambda d: ((d / "bin").write_bytes(b"\xff\xfe"), str(d / "bin"))[1], "not UTF-8"),
    (lambda d: "", "expected the path of a file"),
    (lambda d: 42, "expected the path of a file, got 42"),
], ids=["missing", "directory", "fifo", "too-large", "not-utf8", "empty", "not-a-string"])
def test_an_unreadable_file_is_a_problem_naming_the_key(
        make: object, says: str, tmp_path: Path) -> None:
    given = make(tmp_path)  # type: ignore[operator]
    with pytest.raises(ConfigError) as caught:
        config_from_dict({"postgres": {"dsn": DSN}, "media": {"token_file": given}})
    (problem,) = caught.value.problems
    assert problem.startswith("media.token_file: ") and says in problem


def test_check_config_exits_78_naming_the_key_and_never_prints_the_secret(
        tmp_path: Path) -> None:
    good = tmp_path / "good.toml"
    good.write_text(tomli_w.dumps({"postgres": {
        "dsn_file": str(secret_file(tmp_path, DSN + "\n"))}}))
    bad = tmp_path / "bad.toml"
    bad.write_text(tomli_w.dumps({"postgres": {"dsn": DSN, "dsn_file": "/nonexistent"}}))
    env = {"PATH": os.environ.get("PATH", "")}
    ok = subprocess.run([sys.executable, "-m", "supervision.app", "check-config", "-c",
                         str(good)], capture_output=True, text=True, cwd=ROOT, env=env,
                        check=False)
    assert ok.returncode == 0, ok.stderr
    assert "s3cr3t-pw" not in ok.stdout + ok.stderr and "127.0.0.1" in ok.stdout
    refused = subprocess.run([sys.executable, "-m", "supervision.app", "check-config", "-c",
                              str(bad)], capture_output=True, text=True, cwd=ROOT, env=env,
                             check=False)
    assert refused.returncode == 78
    assert "postgres.dsn_file: postgres.dsn is set too" in refused.stderr
    assert "s3cr3t-pw" not in refused.stdout + refused.stderr
