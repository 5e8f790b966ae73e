"""The dev stack picks listening ports no outgoing connection can take, and tells which of
SeaweedFS's ports another process took, from weed's log."""

from __future__ import annotations

import itertools
import random
import socket

import pytest

from supervision.dev import ports
from supervision.dev.ports import LISTEN_PORTS_FROM, ephemeral_ports, free_ports
from supervision.dev.s3 import taken_port_flag

PORTS = {"master.port": 40001, "filer.port": 40002, "s3.port": 41007}


def test_a_port_refused_by_weeds_start_up_check_names_its_flag() -> None:
    """weed's own check: 'Port allocation failed ... (specified by flag filer.port)'."""
    log = ("F1201 s3.go:1 Port allocation failed: port 40002 for filer"
           " (specified by flag filer.port)")
    assert taken_port_flag(log, PORTS) == "filer.port"


def test_a_port_lost_between_the_check_and_the_bind_names_its_flag() -> None:
    """Taken after weed's check (seen under pytest-xdist: six stacks picking ports at once):
    the listener's 'address already in use' is mapped back to the flag of that port."""
    log = ("F1201 20:01:36.710652 s3.go:434 S3 API Server listener on 127.0.0.1:41007 error:"
           " listen tcp 127.0.0.1:41007: bind: address already in use")
    assert taken_port_flag(log, PORTS) == "s3.port"


def test_any_other_start_up_failure_is_not_a_taken_port() -> None:
    """Another failure, or a port that is not one of ours, is not retried."""
    assert taken_port_flag("F1201 volume.go:9 disk full", PORTS) is None
    assert taken_port_flag("listen tcp 127.0.0.1:9: bind: address already in use",
                           PORTS) is None


def test_picked_ports_are_free_distinct_and_below_the_ephemeral_range() -> None:
    """Listening ports come from below the kernel's range of outgoing local ports (an
    outgoing connection once took a stopped PostgreSQL's port before its restart): each
    is distinct and can be bound."""
    ephemeral = ephemeral_ports()
    ports = free_ports(12)
    assert len(set(ports)) == 12
    assert all(LISTEN_PORTS_FROM <= port < ephemeral.start for port in ports)
    for port in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_a_paired_port_is_free_and_below_the_range_too() -> None:
    """weed's admin port: admin + 10000 (its gRPC port) is also free and not ephemeral."""
    for _ in range(20):
        (admin,) = free_ports(1, paired_at=10000)
        assert admin + 10000 < ephemeral_ports().start
        with socket.socket() as s:
            s.bind(("127.0.0.1", admin + 10000))


def test_a_taken_port_is_never_picked(monkeypatch: pytest.MonkeyPatch) -> None:
    """A port something listens on is skipped, however often the draw lands on it."""
    real_draw = random.Random(7).randrange
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        taken = squatter.getsockname()[1]
        squatter.listen()
        draws = itertools.chain([taken] * 5, iter(lambda: real_draw(10000, 61000), None))
        drawn: list[int] = []

        def draw(*_: int) -> int:
            drawn.append(next(draws))
            return drawn[-1]

        monkeypatch.setattr("supervision.dev.ports.random.randrange", draw)
        monkeypatch.setattr(ports, "ephemeral_ports", lambda: range(61000, 61001))
        (port,) = free_ports(1)
    assert drawn[:5] == [taken] * 5 and port != taken and port == drawn[-1]
