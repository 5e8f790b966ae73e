"""The sd_notify datagram protocol: addresses, fields, the watchdog's interval."""

from __future__ import annotations

import os
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from supervision.tree import systemd_notify
from supervision.tree.systemd_notify import notify, socket_address, watchdog_interval


@pytest.fixture
def path_socket(monkeypatch: pytest.MonkeyPatch) -> Iterator[socket.socket]:
    """A filesystem datagram socket named in NOTIFY_SOCKET (short path: sun_path)."""
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
        path = str(Path(tmp) / "n")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(path)
        sock.settimeout(5)
        monkeypatch.setenv("NOTIFY_SOCKET", path)
        yield sock
        sock.close()


def test_notify_sends_one_datagram_of_newline_separated_fields(
        path_socket: socket.socket) -> None:
    """Every field of one call arrives in one datagram, separated by newlines."""
    assert notify("READY=1", "STATUS=tree safetynet running")
    assert path_socket.recv(4096) == b"READY=1\nSTATUS=tree safetynet running"


def test_abstract_namespace_address_replaces_the_at_sign_with_a_nul() -> None:
    """'@name' is the abstract socket '\\0name'; a path stays a path; unset is None."""
    assert socket_address({"NOTIFY_SOCKET": "@sd/notify"}) == "\0sd/notify"
    assert socket_address({"NOTIFY_SOCKET": "/run/systemd/notify"}) == "/run/systemd/notify"
    assert socket_address({}) is None


def test_notify_reaches_an_abstract_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    """A datagram sent to '@name' is received on the abstract socket of that name."""
    name = f"safetynet-unit-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(5)
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        assert notify("WATCHDOG=1")
        assert sock.recv(4096) == b"WATCHDOG=1"


def test_notify_without_socket_or_with_a_dead_one_is_a_quiet_no_op(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Not under systemd: nothing sent; a socket nobody reads: False, never raised."""
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert notify("READY=1") is False
    monkeypatch.setattr(systemd_notify, "_failed_once", False)
    monkeypatch.setenv("NOTIFY_SOCKET", "@safetynet-nobody-listens-here")
    assert notify("READY=1") is False


def test_watchdog_interval_is_watchdog_usec_for_this_process_only() -> None:
    """WATCHDOG_USEC in seconds; None when unset, zero, garbage or for another pid."""
    assert watchdog_interval({"WATCHDOG_USEC": "30000000"}) == 30.0
    assert watchdog_interval({"WATCHDOG_USEC": "500000",
                              "WATCHDOG_PID": str(os.getpid())}) == 0.5
    assert watchdog_interval({"WATCHDOG_USEC": "500000", "WATCHDOG_PID": "1"}) is None
    assert watchdog_interval({"WATCHDOG_USEC": "0"}) is None
    assert watchdog_interval({"WATCHDOG_USEC": "soon"}) is None
    assert watchdog_interval({}) is None
