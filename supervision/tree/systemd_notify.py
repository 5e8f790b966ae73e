"""systemd's notify protocol (``sd_notify(3)``), for ``Type=notify`` with ``WatchdogSec``.

>>> notify("READY=1", "STATUS=tree safetynet running")

The service manager passes a datagram socket in ``NOTIFY_SOCKET``: a filesystem path, or
an abstract-namespace name written with a leading ``@`` (the kernel's leading NUL). Each
notification is one datagram of newline-separated ``KEY=VALUE`` fields. Without
``NOTIFY_SOCKET`` (not started by systemd) every call is a no-op, so the daemon needs no
setting to run either way. A send that fails (the manager went away) is logged once and
never raised: notification is advice to the manager, not a duty of the daemon.

The watchdog: with ``WatchdogSec=`` the manager sets ``WATCHDOG_USEC`` (and
``WATCHDOG_PID``, the process meant); :func:`serve_watchdog` sends ``WATCHDOG=1`` at half
that interval while its health check passes, so a daemon whose event loop is stuck, or
whose root supervisor is stopping or escalating, stops petting it and is restarted.

Only ``AF_UNIX`` sockets are spoken (systemd's ``vsock:`` addresses, for VMs, are not).
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Mapping

import structlog
import trio

log = structlog.get_logger("systemd_notify")

_failed_once = False


def socket_address(environ: Mapping[str, str] | None = None) -> str | None:
    """The address in ``NOTIFY_SOCKET``, abstract names with their NUL; None when unset."""
    path = (os.environ if environ is None else environ).get("NOTIFY_SOCKET", "")
    if not path:
        return None
    return "\0" + path[1:] if path.startswith("@") else path


def notify(*fields: str) -> bool:
    """Send one notification (``"READY=1"``, ``"STATUS=..."``); True when it was sent."""
    global _failed_once
    address = socket_address()
    if address is None:
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.setblocking(False)  # a full queue is a failed send, never a stalled loop
            sock.connect(address)
            sock.sendall("\n".join(fields).encode())
    except OSError as exc:
        if not _failed_once:
            _failed_once = True
            log.warning("systemd_notify_failed", error=type(exc).__name__)
        return False
    return True


def reloading() -> bool:
    """``RELOADING=1`` with the monotonic timestamp systemd asks for (SIGHUP)."""
    now_us = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    return notify("RELOADING=1", f"MONOTONIC_USEC={now_us}")


def watchdog_interval(environ: Mapping[str, str] | None = None) -> float | None:
    """``WATCHDOG_USEC`` in seconds when the watchdog is meant for this process."""
    env = os.environ if environ is None else environ
    usec, pid = env.get("WATCHDOG_USEC", ""), env.get("WATCHDOG_PID", "")
    if not usec.isdigit() or int(usec) == 0:
        return None
    if pid and pid != str(os.getpid()):
        return None
    return int(usec) / 1_000_000


async def serve_watchdog(healthy: Callable[[], bool], interval: float) -> None:
    """``WATCHDOG=1`` every ``interval / 2`` seconds while *healthy()*, until cancelled."""
    while True:
        if healthy():
            notify("WATCHDOG=1")
        await trio.sleep(interval / 2)
