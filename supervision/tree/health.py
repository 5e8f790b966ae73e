"""Process health shared by the actors and read by ``/healthz`` and ``/readyz``.

Liveness follows the root supervisor: healthy while it runs the tree, unhealthy from the
moment it starts shutting down (a signal) or escalating (a child beyond its restart
intensity) — the exporter is the last child to stop, so without this it would answer
200 for the whole shutdown.

A configuration fault (S3 bucket missing, access denied) makes the process unready until
a later probe finds the dependency healthy again; readiness is also lost while PostgreSQL
does not answer (checked by the metrics exporter) and while the root is not running.
"""

from __future__ import annotations

import enum
import re

import attrs

from supervision.metrics import CONFIG_FAULT

SUMMARY_CHARS = 120
# an IPv4 address, a bracketed IPv6 address, or HOST:PORT
_HOSTISH = re.compile(r"\b\d{1,3}(?:\.\d{1,3}){3}(?::\d+)?\b|\[[0-9a-fA-F:.]+\](?::\d+)?|"
                      r"\b[A-Za-z0-9][A-Za-z0-9.-]*:\d{2,5}\b")


class RootState(enum.Enum):
    """What the root supervisor is doing."""

    RUNNING = "running"
    SHUTTING_DOWN = "shutting down"
    ESCALATING = "escalating"


@attrs.define
class Health:
    faults: dict[str, str] = attrs.field(factory=dict)  # component -> one-line reason
    root: RootState = RootState.RUNNING
    root_detail: str = ""

    def set_fault(self, component: str, reason: str) -> None:
        self.faults[component] = reason
        CONFIG_FAULT.labels(component=component).set(1)

    def clear_fault(self, component: str) -> None:
        self.faults.pop(component, None)
        CONFIG_FAULT.labels(component=component).set(0)

    def set_root(self, state: RootState, detail: str = "") -> None:
        self.root, self.root_detail = state, detail

    def reason(self) -> str | None:
        """The first active fault as one line, or None when there is none."""
        for component, reason in sorted(self.faults.items()):
            return f"configuration fault in {component}: {reason}"
        return None

    def summary(self) -> str | None:
        """The first active fault for ``/readyz``'s body, bounded and without addresses:
        its component and the first clause of its reason (at most
        :data:`SUMMARY_CHARS`, addresses and HOST:PORT replaced by ``<host>``), and how
        many other faults (components, topics) there are. The whole reasons are in the log
        (``config_fault``) and in :meth:`reason`."""
        if not self.faults:
            return None
        component = min(self.faults)
        first, *rest = self.faults[component].split("; ")  # a fault per topic
        first = _HOSTISH.sub("<host>", first)
        if len(first) > SUMMARY_CHARS:
            first = first[:SUMMARY_CHARS] + "..."
        more = len(self.faults) - 1 + len(rest)
        tail = f" (and {more} more; see the log)" if more else ""
        return f"configuration fault in {component}: {first}{tail}"

    def liveness_reason(self) -> str | None:
        """Why the process is not healthy (the root is stopping), or None."""
        if self.root is RootState.RUNNING:
            return None
        detail = f" ({self.root_detail})" if self.root_detail else ""
        return f"supervisor {self.root.value}{detail}"


HEALTH = Health()
