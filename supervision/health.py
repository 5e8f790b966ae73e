"""Process health shared by the actors and read by ``/readyz``.

A configuration fault (S3 bucket missing, access denied) makes the process unready until
a later probe finds the dependency healthy again; readiness is also lost while PostgreSQL
does not answer (checked by the metrics exporter).
"""

from __future__ import annotations

import attrs

from supervision.metrics import CONFIG_FAULT


@attrs.define
class Health:
    faults: dict[str, str] = attrs.field(factory=dict)  # component -> one-line reason

    def set_fault(self, component: str, reason: str) -> None:
        self.faults[component] = reason
        CONFIG_FAULT.labels(component=component).set(1)

    def clear_fault(self, component: str) -> None:
        self.faults.pop(component, None)
        CONFIG_FAULT.labels(component=component).set(0)

    def reason(self) -> str | None:
        """The first active fault as one line, or None when there is none."""
        for component, reason in sorted(self.faults.items()):
            return f"configuration fault in {component}: {reason}"
        return None


HEALTH = Health()
