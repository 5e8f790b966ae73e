"""Throwaway certificate authorities for the TLS tests (``trustme``), as session fixtures.

>>> def test_x(private_ca: PrivateCa) -> None:
...     context = private_ca.server_context()          # serves 127.0.0.1 and localhost
...     cfg = make_config(dsn, media={"ca_file": str(private_ca.ca_file)})

``private_ca`` signs the servers' certificates; ``stranger_ca`` is another CA that signed
nothing the tests serve, so trusting it alone must fail every handshake.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest
import trustme

__all__ = ["PrivateCa", "private_ca", "stranger_ca"]

SERVER_NAMES = ("127.0.0.1", "localhost")


@attrs.frozen
class PrivateCa:
    ca: trustme.CA
    ca_file: Path  # the CA certificate, PEM: what a client is told to trust
    cert_file: Path  # the server's chain for SERVER_NAMES, PEM
    key_file: Path  # the server's private key, PEM

    def server_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.cert_file, self.key_file)
        return context


def make_ca(directory: Path) -> PrivateCa:
    """A new CA and a server certificate for loopback, written under *directory*."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA()
    server = ca.issue_cert(*SERVER_NAMES)
    ca_file, cert_file, key_file = (directory / n for n in ("ca.pem", "server.pem", "server.key"))
    ca.cert_pem.write_to_path(str(ca_file))
    server.private_key_pem.write_to_path(str(key_file))
    cert_file.write_bytes(b"".join(blob.bytes() for blob in server.cert_chain_pems))
    key_file.chmod(0o600)
    return PrivateCa(ca, ca_file, cert_file, key_file)


@pytest.fixture(scope="session")
def private_ca(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateCa]:
    yield make_ca(tmp_path_factory.mktemp("private-ca"))


@pytest.fixture(scope="session")
def stranger_ca(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateCa]:
    yield make_ca(tmp_path_factory.mktemp("stranger-ca"))
