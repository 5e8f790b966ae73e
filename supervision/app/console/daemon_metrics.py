"""What the daemon on this host says of itself, read from its ``/metrics`` (``http.listen``).

>>> seen = await scrape(cfg.http.listen)
>>> seen.breaker_open, seen.config_faults, seen.runs[Job.RECORDING_FINALIZE]
(False, [], {'ok': 412.0, 'error': 1.0})

The database holds what every replica shares (leases, pauses, backlogs); the breaker, the
configuration faults, the cycle counters and each job's last cycle (its counts, status and
end: ``safetynet_last_cycle``) live in a daemon's process. The console reads
them from the daemon whose ``http.listen`` its configuration names (bounded: one GET within
:data:`DEADLINE_S`, at most :data:`MAX_BYTES` read), and says so plainly when that daemon
does not answer — the console itself works without it.
"""

from __future__ import annotations

import math
import time
from typing import Any

import anyio
import attrs
import httpx
from prometheus_client.parser import text_string_to_metric_families

from supervision.jobs import Job
from supervision.tls import public_context

TIMEOUT_S = 1.0  # each connect, read
DEADLINE_S = 2.0  # the whole GET (a daemon dripping bytes)
MAX_BYTES = 2 * 1024 * 1024
RUNS = {"messenger_recording_finalize_run": Job.RECORDING_FINALIZE,
        "messenger_conf_reaper_run": Job.CONFERENCE_REAPER}
DURATIONS = {"messenger_recording_finalize_cycle_duration_seconds": Job.RECORDING_FINALIZE,
             "messenger_conf_reaper_cycle_duration_seconds": Job.CONFERENCE_REAPER}


@attrs.frozen
class DaemonView:
    url: str
    why: str = ""  # non-empty: not reachable, and why
    breaker_open: bool = False
    config_faults: list[str] = attrs.field(factory=list)
    runs: dict[str, dict[str, float]] = attrs.field(factory=dict)
    mean_cycle_s: dict[str, float] = attrs.field(factory=dict)
    leading: list[str] = attrs.field(factory=list)  # jobs whose lease this daemon holds
    reaped: dict[str, float] = attrs.field(factory=dict)
    # each job's last cycle in that daemon: its counts, its status, how long ago it ended
    last_cycle: dict[str, dict[str, float]] = attrs.field(factory=dict)
    last_status: dict[str, str] = attrs.field(factory=dict)
    last_age_s: dict[str, float] = attrs.field(factory=dict)
    # safetynet_outbox_delivery_seconds: events observed, their mean and p99 (a bucket's
    # upper bound; None: none observed)
    delivery: tuple[float, float, float] | None = None


async def scrape(listen: str) -> DaemonView:
    url = f"http://{listen}/metrics"
    with anyio.move_on_after(DEADLINE_S):
        return await _scrape(url)
    return DaemonView(url, f"no whole answer within {DEADLINE_S:g} s")


async def _scrape(url: str) -> DaemonView:
    try:
        # plain http on loopback: the shared context spares a load of the CA bundle a page
        async with httpx.AsyncClient(timeout=TIMEOUT_S, verify=public_context()) as client, \
                client.stream("GET", url) as response:
            if response.status_code != 200:
                return DaemonView(url, f"HTTP {response.status_code}")
            body = bytearray()
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) > MAX_BYTES:  # never read past the cap
                    return DaemonView(url, f"metrics larger than {MAX_BYTES} bytes")
    except httpx.HTTPError as exc:
        return DaemonView(url, f"{type(exc).__name__} (is `safetynet run` up on this host?)")
    return parse(url, body.decode("utf-8", errors="replace"))


def parse(url: str, text: str, now: float | None = None) -> DaemonView:
    runs: dict[str, dict[str, float]] = {}
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    faults: list[str] = []
    leading: list[str] = []
    reaped: dict[str, float] = {}
    last: dict[str, dict[str, float]] = {}
    last_status: dict[str, str] = {}
    last_age: dict[str, float] = {}
    now = time.time() if now is None else now
    breaker = False
    try:
        families = list(text_string_to_metric_families(text))
    except ValueError as exc:
        return DaemonView(url, f"unreadable metrics: {type(exc).__name__}")
    for family in families:
        for sample in family.samples:
            name, labels, value = sample.name, sample.labels, sample.value
            if name.removesuffix("_total") in RUNS and name.endswith("_total"):
                job = RUNS[name.removesuffix("_total")]
                runs.setdefault(job, {})[labels.get("status", "")] = value
            elif name.removesuffix("_sum") in DURATIONS and name.endswith("_sum"):
                sums[DURATIONS[name.removesuffix("_sum")]] = value
            elif name.removesuffix("_count") in DURATIONS and name.endswith("_count"):
                counts[DURATIONS[name.removesuffix("_count")]] = value
            elif name == "safetynet_s3_breaker_open":
                breaker = breaker or value > 0
            elif name == "safetynet_config_fault" and value > 0:
                faults.append(labels.get("component", "?"))
            elif name == "safetynet_lock_held" and value > 0:
                leading.append(labels.get("job", "?"))
            elif name == "messenger_conf_reaper_items_total":
                reaped[labels.get("outcome", "?")] = value
            elif name == "safetynet_last_cycle":
                last.setdefault(labels.get("job", "?"), {})[labels.get("outcome", "?")] = value
            elif name == "safetynet_last_cycle_end_timestamp_seconds":
                last_status[labels.get("job", "?")] = labels.get("status", "?")
                last_age[labels.get("job", "?")] = max(0.0, now - value)
    mean = {job: sums[job] / n for job, n in counts.items() if n and job in sums}
    return DaemonView(url, "", breaker, sorted(faults), runs, mean, sorted(leading), reaped,
                      last, last_status, last_age, delivery(families))


def delivery(families: list[Any]) -> tuple[float, float, float] | None:
    """(events, mean seconds, p99 seconds as the bound of the bucket that holds it) of
    ``safetynet_outbox_delivery_seconds``, commit to Kafka's acknowledgement."""
    buckets: list[tuple[float, float]] = []
    count = total = 0.0
    for family in families:
        if family.name != "safetynet_outbox_delivery_seconds":
            continue
        for sample in family.samples:
            if sample.name.endswith("_bucket"):
                buckets.append((float(sample.labels.get("le", "inf")), sample.value))
            elif sample.name.endswith("_count"):
                count = sample.value
            elif sample.name.endswith("_sum"):
                total = sample.value
    if not count:
        return None
    p99 = next((bound for bound, seen in sorted(buckets) if seen >= 0.99 * count),
               math.inf)
    return count, total / count, p99
