"""The [s3] settings of issue 16: how a URL is addressed, which CA is trusted, which
key pairs are accepted — checked at load time, one line per problem."""

from __future__ import annotations

from pathlib import Path

import pytest
import trustme

from actors.s3.worker import object_url
from supervision.config import S3Config, load_config
from supervision.errors import ConfigError

DSN = "postgresql://app@127.0.0.1:5432/messenger"


def problems(tmp_path: Path, s3: str) -> list[str]:
    path = tmp_path / "c.toml"
    path.write_text(f'[postgres]\ndsn = "{DSN}"\n[s3]\n{s3}')
    with pytest.raises(ConfigError) as info:
        load_config([path], {})
    return info.value.problems


@pytest.mark.parametrize(("cfg", "key", "url"), [
    (S3Config(endpoint_url="http://127.0.0.1:8333", bucket="rec"), "p/a b",
     "http://127.0.0.1:8333/rec/p/a%20b"),
    (S3Config(endpoint_url="http://127.0.0.1:8333/", bucket="rec"), "",
     "http://127.0.0.1:8333/rec"),
    (S3Config(endpoint_url="https://s3.example.com:9000", bucket="rec",
              addressing_style="virtual"), "p/a b", "https://rec.s3.example.com:9000/p/a%20b"),
    (S3Config(endpoint_url="https://s3.example.com", bucket="rec",
              addressing_style="virtual"), "", "https://rec.s3.example.com/"),
    (S3Config(endpoint_url="https://gw.example.com/s3", bucket="rec"), "k",
     "https://gw.example.com/s3/rec/k"),
], ids=["path", "path-bucket", "virtual", "virtual-bucket", "path-under-prefix"])
def test_path_style_puts_the_bucket_in_the_path_and_virtual_style_in_the_host(
        cfg: S3Config, key: str, url: str) -> None:
    """The URL of a key (and of the bucket itself) in each addressing style."""
    assert object_url(cfg, key) == url


def test_an_unknown_addressing_style_is_refused(tmp_path: Path) -> None:
    """Only path and virtual are accepted."""
    assert problems(tmp_path, 'addressing_style = "dns"\n') == [
        "s3.addressing_style: must be one of path, virtual; got 'dns'"]


def test_virtual_style_needs_a_bucket_that_is_a_host_label(tmp_path: Path) -> None:
    """A bucket with a dot cannot go in front of the host name (its TLS name breaks)."""
    assert problems(tmp_path, 'addressing_style = "virtual"\nbucket = "a.b"\n') == [
        "s3.bucket: 'a.b' cannot be a host name label (lower case, no dots or underscores) "
        "with s3.addressing_style = virtual"]


def test_half_a_static_key_pair_is_refused(tmp_path: Path) -> None:
    """A key id without its secret would silently fall through to the chain: refused."""
    assert problems(tmp_path, 'access_key_id = "AKID"\n') == [
        "s3.secret_access_key: must be set together with access_key_id (or leave both "
        "empty to use the credential chain)"]


def test_a_ca_file_that_is_missing_or_not_pem_is_refused(tmp_path: Path) -> None:
    """ca_file must be a readable PEM file; the message names the key and the path."""
    missing = tmp_path / "missing.pem"
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    endpoint = 'endpoint_url = "https://127.0.0.1:8443"\n'
    assert problems(tmp_path, f'{endpoint}ca_file = "{missing}"\n') == [
        f"s3.ca_file: cannot read '{missing}': No such file or directory"]
    assert problems(tmp_path, f'{endpoint}ca_file = "{junk}"\n') == [
        f"s3.ca_file: '{junk}' holds no PEM certificate"]


def test_a_ca_file_needs_an_https_endpoint(tmp_path: Path) -> None:
    """A private CA for a plain-HTTP endpoint is a mistake worth a line."""
    ca = tmp_path / "ca.pem"
    trustme.CA().cert_pem.write_to_path(str(ca))
    assert problems(tmp_path, f'ca_file = "{ca}"\n') == [
        "s3.ca_file: set, but s3.endpoint_url is not https://"]
    path = tmp_path / "ok.toml"
    path.write_text(f'[postgres]\ndsn = "{DSN}"\n[s3]\nendpoint_url = "https://127.0.0.1:1"\n'
                    f'ca_file = "{ca}"\n')
    assert load_config([path], {}).s3.ca_file == str(ca)
