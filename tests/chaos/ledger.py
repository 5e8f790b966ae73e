"""A Kafka consumer ledger: every message of the safetynet topics, with its offset.

The checker compares it with the outbox: every event id seen, an event id always with the
same (topic, key, payload), and per key the first delivery of each event in outbox order.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Collection, Iterable

from actors.audit.ledger import TOPICS, Entry, Ledger, entry_of

__all__ = ["TOPICS", "Entry", "Ledger", "Offsets", "end_offsets", "read_ledger"]


Offsets = dict[tuple[str, int], int]


def end_offsets(bootstrap: str, topics: Iterable[str] = TOPICS) -> Offsets:
    """Where each topic ends now: a ledger read ``since`` these sees only later messages
    (tests share a broker)."""
    return asyncio.run(_ends(bootstrap, tuple(topics)))


async def _ends(bootstrap: str, topics: tuple[str, ...]) -> Offsets:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        await consumer._client.force_metadata_update()
        tps = [TopicPartition(t, p) for t in topics
               for p in (consumer.partitions_for_topic(t) or set())]
        ends = await consumer.end_offsets(tps) if tps else {}
        return {(tp.topic, tp.partition): off for tp, off in ends.items()}
    finally:
        await consumer.stop()


def read_ledger(bootstrap: str, topics: Iterable[str] = TOPICS, *,
                expect: Collection[str] = (), since: Offsets | None = None,
                limit_s: float = 30.0) -> Ledger:
    """Read every topic from *since* (default: the start) until the ledger holds every
    event id in *expect* (and reached the end), until idle for a second, or *limit_s*."""
    deadline = time.monotonic() + limit_s
    want = set(expect)
    while True:
        ledger = asyncio.run(_read(bootstrap, tuple(topics), want, since or {}, deadline))
        if want <= ledger.event_ids() or time.monotonic() > deadline:
            return ledger
        time.sleep(0.5)


async def _read(bootstrap: str, topics: tuple[str, ...], want: set[str], since: Offsets,
                deadline: float) -> Ledger:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                request_timeout_ms=10000)
    await consumer.start()
    ledger = Ledger()
    try:
        await consumer._client.force_metadata_update()
        tps = [TopicPartition(t, p) for t in topics
               for p in (consumer.partitions_for_topic(t) or set())]
        if not tps:
            return ledger
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, since.get((tp.topic, tp.partition), 0))
        ends = await consumer.end_offsets(tps)
        idle_since = time.monotonic()
        while time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=200)
            got = [m for msgs in batch.values() for m in msgs]
            if got:
                idle_since = time.monotonic()
            ledger.entries.extend(entry_of(m) for m in got)
            at_end = True
            for tp in tps:
                at_end = at_end and await consumer.position(tp) >= ends[tp]
            if at_end and want <= ledger.event_ids():
                break
            if at_end and time.monotonic() - idle_since > 1.0:
                break
    finally:
        await consumer.stop()
    return ledger
