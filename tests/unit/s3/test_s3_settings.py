"""The [s3] settings of issue 16: how a URL is addressed, how a handle signs, which CA is
trusted, which key pairs are accepted (checked at load time, one line per problem)."""

from __future__ import annotations

import http.server
import threading
from pathlib import Path

import pycurl
import pytest
import trustme

from actors.s3.wire import Credentials
from actors.s3.worker import list_url, object_url, sign_with
from supervision.app.settings import load_config
from supervision.config import S3Config
from supervision.errors import ConfigError
from supervision.secrets import Secret

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


@pytest.mark.parametrize(("style", "url"), [
    ("path", "http://127.0.0.1:8333/rec?delimiter=%2F&list-type=2&max-keys=20"
             "&prefix=call%20recs%2F%C3%A9%2B"),
    ("virtual", "http://rec.127.0.0.1:8333/?delimiter=%2F&list-type=2&max-keys=20"
                "&prefix=call%20recs%2F%C3%A9%2B"),
])
def test_the_evidence_listing_asks_for_20_keys_under_the_prefix_in_signing_order(
        style: str, url: str) -> None:
    """ListObjectsV2 on the bucket: parameters sorted as SigV4 canonicalises them, the
    prefix percent-encoded whole (slash, space, '+', UTF-8)."""
    cfg = S3Config(endpoint_url="http://127.0.0.1:8333", bucket="rec",
                   key_prefix="call recs/\u00e9+", addressing_style=style)
    assert list_url(cfg) == url


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


def test_a_handle_follows_new_keys_drops_a_stale_token_and_can_go_unsigned() -> None:
    """sign_with on one reused libcurl handle: SigV4 with the session token header, then
    unsigned (no Authorization at all), then other keys without a token (none sent)."""
    seen: list[dict[str, str]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self) -> None:
            seen.append({k.lower(): v for k, v in self.headers.items()})
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    handle = pycurl.Curl()
    handle.setopt(pycurl.NOBODY, 1)
    handle.setopt(pycurl.URL, f"http://127.0.0.1:{server.server_address[1]}/b/k")
    try:
        for creds in (Credentials(Secret("AK1"), Secret("SK1"), Secret("TOKEN1")), None,
                      Credentials(Secret("AK2"), Secret("SK2"))):
            sign_with(handle, creds, "eu-west-1")
            handle.perform()
    finally:
        handle.close()
        server.shutdown()
        server.server_close()
    first, unsigned, second = seen
    assert first["authorization"].startswith("AWS4-HMAC-SHA256 Credential=AK1/")
    assert "/eu-west-1/s3/aws4_request" in first["authorization"]
    assert first["x-amz-security-token"] == "TOKEN1"
    assert "authorization" not in unsigned and "x-amz-security-token" not in unsigned
    assert second["authorization"].startswith("AWS4-HMAC-SHA256 Credential=AK2/")
    assert "x-amz-security-token" not in second
