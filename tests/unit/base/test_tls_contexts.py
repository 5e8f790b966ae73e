"""Client TLS contexts (supervision.tls): certifi's loaded once and shared, a private CA
file read again at each call, both verifying chain and host name."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from supervision.errors import ConfigError
from supervision.tls import public_context, verifying_context
from tests.pki import make_ca


def test_public_cas_are_loaded_once_and_shared_by_every_client() -> None:
    first = verifying_context("", "media.ca_file")
    assert first is verifying_context("", "media.ca_file") is public_context()
    assert first.verify_mode == ssl.CERT_REQUIRED and first.check_hostname
    assert len(first.get_ca_certs()) > 50  # certifi's bundle, not an empty store


def test_a_private_ca_file_is_read_again_at_each_call(tmp_path: Path) -> None:
    """A CA file replaced since the last call is what the next context trusts; a file gone
    meanwhile is a configuration error naming the key."""
    ca_file = tmp_path / "ca.pem"
    first_ca = make_ca(tmp_path / "one")
    ca_file.write_bytes(first_ca.ca_file.read_bytes())
    first = verifying_context(str(ca_file), "media.ca_file")
    second_ca = make_ca(tmp_path / "two")
    ca_file.write_bytes(second_ca.ca_file.read_bytes())
    second = verifying_context(str(ca_file), "media.ca_file")
    assert first is not second and second is not public_context()
    assert first.verify_mode == second.verify_mode == ssl.CERT_REQUIRED
    assert first.get_ca_certs() != second.get_ca_certs()
    assert [c["subject"] for c in second.get_ca_certs()] == [
        c["subject"] for c in ssl.create_default_context(
            cafile=str(second_ca.ca_file)).get_ca_certs()]
    ca_file.unlink()
    with pytest.raises(ConfigError, match=r"media\.ca_file: cannot load .*no such file"):
        verifying_context(str(ca_file), "media.ca_file")
