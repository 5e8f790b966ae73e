"""Tansu behind TLS: Debian's ``stunnel`` terminates TLS in front of the broker.

>>> with open_tls_kafka(tmp_path, pki) as kafka:   # Tansu advertises stunnel's port
...     kafka.bootstrap_servers                     # "127.0.0.1:<stunnel port>"

Tansu 0.6 serves no working TLS itself, so the terminator holds the broker certificate
(issued by a throwaway ``trustme`` CA) and forwards plaintext to Tansu on loopback;
Tansu advertises the terminator's port, so every connection a client makes after the
bootstrap goes through TLS too. With ``client_ca`` the terminator also demands a client
certificate signed by that CA (mutual TLS).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import attrs
import pytest
import trustme

from supervision.dev.kafka import KafkaServer
from supervision.dev.ports import free_ports
from tests.waiting import wait_until


def stunnel() -> str:
    """The stunnel binary, or skip the test saying how to get it."""
    found = shutil.which("stunnel4") or shutil.which("stunnel")
    if found is None:
        pytest.skip("stunnel not installed: .ci/run installs Debian's stunnel4 package")
    return found


@attrs.frozen
class Pki:
    """A throwaway CA, the broker certificate it signed, a client certificate and key it
    signed, and a second CA that signed nothing the broker shows."""

    ca: Path
    server: Path  # key + certificate chain, as stunnel reads it
    client_cert: Path
    client_key: Path
    other_ca: Path


def make_pki(directory: Path) -> Pki:
    directory.mkdir(parents=True, exist_ok=True)
    ca, other = trustme.CA(), trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert("safetynet.client")
    pki = Pki(directory / "ca.pem", directory / "server.pem", directory / "client.pem",
              directory / "client.key", directory / "other-ca.pem")
    ca.cert_pem.write_to_path(str(pki.ca))
    server.private_key_and_cert_chain_pem.write_to_path(str(pki.server))
    client.cert_chain_pems[0].write_to_path(str(pki.client_cert))
    client.private_key_pem.write_to_path(str(pki.client_key))
    other.cert_pem.write_to_path(str(pki.other_ca))
    for path in (pki.server, pki.client_key):
        path.chmod(0o600)
    return pki


@attrs.frozen
class TlsKafka:
    broker: KafkaServer  # Tansu itself (plaintext, loopback)
    port: int  # the terminator's TLS port, the one Tansu advertises

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"


@contextmanager
def open_tls_kafka(directory: Path, pki: Pki, *, client_ca: Path | None = None,
                   authentication: bool = False) -> Iterator[TlsKafka]:
    """A Tansu of its own behind stunnel on a free port; both stopped on exit."""
    binary = stunnel()
    directory.mkdir(parents=True, exist_ok=True)
    port = free_ports(1)[0]
    broker = KafkaServer(directory, advertised_port=port, authentication=authentication)
    verify = ("" if client_ca is None
              else f"CAfile = {client_ca}\nverifyChain = yes\nrequireCert = yes\n")
    conf = directory / "stunnel.conf"
    conf.write_text(f"foreground = yes\npid =\n[kafka]\naccept = 127.0.0.1:{port}\n"
                    f"connect = 127.0.0.1:{broker.port}\ncert = {pki.server}\n{verify}")
    broker.start()
    try:
        with (directory / "stunnel.log").open("wb") as log:
            proc = subprocess.Popen([binary, str(conf)], stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_until(lambda: proc.poll() is not None or _accepts(port), 10,
                       "stunnel to listen")
            assert proc.poll() is None, (directory / "stunnel.log").read_text()
            yield TlsKafka(broker, port)
        finally:
            proc.terminate()
            proc.wait(10)
    finally:
        broker.stop()


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False
