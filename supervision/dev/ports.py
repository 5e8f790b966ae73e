"""Listening ports for the dev stack's servers: free now, and below the kernel's ephemeral
range so no outgoing connection takes one between the pick and the bind."""

from __future__ import annotations

import random
import socket
from pathlib import Path

LISTEN_PORTS_FROM = 10000  # below: the usual ports of well-known and registered services
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def ephemeral_ports() -> range:
    """The kernel's range of local ports for outgoing connections."""
    try:
        low, high = (int(part) for part in _EPHEMERAL_RANGE.read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999  # Linux's default
    return range(low, high + 1)


def free_ports(count: int, *, paired_at: int = 0) -> list[int]:
    """Distinct ports free on 127.0.0.1 now (all bound at once, then released), picked at
    random below the kernel's ephemeral range: an outgoing connection never takes one as
    its local port between the pick and the server's bind, nor while a server is stopped
    for a restart on the same port. With *paired_at*, ``port + paired_at`` is free and
    below the range too (weed's admin gRPC port). Where the range leaves no room below it,
    the kernel picks (port 0)."""
    top = ephemeral_ports().start - paired_at
    if top - LISTEN_PORTS_FROM < 1000 * count:
        return _kernel_ports(count, paired_at)
    socks: list[socket.socket] = []
    try:
        while len(socks) < count:
            port = random.randrange(LISTEN_PORTS_FROM, top)
            if paired_at and not port_free(port + paired_at):
                continue
            sock = socket.socket()
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                sock.close()
                continue
            socks.append(sock)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _kernel_ports(count: int, paired_at: int) -> list[int]:
    socks = [socket.socket() for _ in range(count)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        ports = [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()
    if paired_at and not all(p + paired_at < 65536 and port_free(p + paired_at)
                             for p in ports):
        return _kernel_ports(count, paired_at)
    return ports



def port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True

