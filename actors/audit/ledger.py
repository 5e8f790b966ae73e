"""What was published, against the outbox: the Kafka invariants of ``safetynet audit --kafka``
(and of the chaos checker, which reads its own ledger).

>>> window = asyncio.run(read_window(cfg.kafka, TOPICS, since_ms, max_messages=100_000,
...                                  timeout_s=30, max_bytes=256 << 20))
>>> check_ledger(outbox_rows, window.ledger)     # -> [Violation, ...]

The read is bounded: it starts at the offsets of *since_ms* (``offsets_for_times``, never
at offset 0), stops once past the end offsets taken when it began and a fetch comes back
empty, after *max_messages*, after *max_bytes* of keys, values and headers (a topic of
large messages fills memory long before it holds many; each fetch is capped by it too)
or after *timeout_s*; a read that stopped early is ``complete=False`` and judges nothing.

Invariants: ``not_in_ledger`` (a row published in the judged window whose event id is not
on the topic), ``ledger_inconsistent`` (one event id with another topic/key/payload than
its row), ``unknown_event`` (an event id on the topic that no outbox row has), ``order``
(per topic + key, the first delivery of each event is not in outbox-id order).
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Collection, Iterable, Sequence
from typing import Any

import attrs

from actors.audit.invariants import Invariant, Violation
from actors.envelope import TOPIC_CONFERENCE_ENDED, TOPIC_RECORDING_AVAILABLE, event_id
from actors.kafka.security import client_security
from supervision.config import KafkaConfig

TOPICS = (TOPIC_RECORDING_AVAILABLE, TOPIC_CONFERENCE_ENDED)


@attrs.frozen
class Entry:
    topic: str
    partition: int
    offset: int
    key: str | None
    event_id: str | None
    payload: Any


@attrs.define
class Ledger:
    entries: list[Entry] = attrs.field(factory=list)

    def event_ids(self) -> set[str]:
        return {e.event_id for e in self.entries if e.event_id}

    def about(self, subjects: Collection[str]) -> Ledger:
        """Only the events about these recordings/conferences (payload RecordingId or
        ConferenceId): a broker shared by several tests carries others' events too."""
        return Ledger([e for e in self.entries if subject_of(e.payload) in subjects])

    def subjects(self) -> set[str]:
        return {s for e in self.entries if (s := subject_of(e.payload)) is not None}

    def to_json(self) -> list[dict[str, Any]]:
        return [attrs.asdict(e) for e in self.entries]


@attrs.frozen
class OutboxRow:
    id: int
    topic: str
    key: str
    dedupe_key: str
    payload: Any
    published: bool
    judged: bool = True  # published inside the window the topic read covers


def subject_of(payload: Any) -> str | None:
    if not isinstance(payload, dict):
        return None
    subject = payload.get("RecordingId") or payload.get("ConferenceId")
    return None if subject is None else str(subject)


def check_ledger(outbox: Sequence[OutboxRow], ledger: Ledger) -> list[Violation]:
    """The ledger against the outbox rows."""
    out: list[Violation] = []
    rows = {event_id(r.topic, r.dedupe_key): r for r in outbox}
    seen = ledger.event_ids()
    out += [Violation(Invariant.NOT_IN_LEDGER, eid, f"outbox id {row.id}")
            for eid, row in rows.items() if row.published and row.judged and eid not in seen]
    by_id: dict[str, list[Entry]] = defaultdict(list)
    for entry in ledger.entries:
        if entry.event_id is None or entry.event_id not in rows:
            out.append(Violation(Invariant.UNKNOWN_EVENT, str(entry.event_id),
                                 f"{entry.topic}@{entry.partition}:{entry.offset}"))
            continue
        by_id[entry.event_id].append(entry)
    for eid, entries in by_id.items():
        row = rows[eid]
        variants = {(e.topic, e.key, json.dumps(e.payload, sort_keys=True)) for e in entries}
        expected = (row.topic, row.key, json.dumps(row.payload, sort_keys=True))
        if variants != {expected}:
            out.append(Violation(Invariant.LEDGER_INCONSISTENT, eid,
                                 f"outbox id {row.id}: {len(variants)} variant(s) on the topic"))
    # per (topic, key): first delivery of each event, in offset order, must follow outbox ids
    first: dict[str, tuple[int, int]] = {}
    for entry in ledger.entries:
        if entry.event_id in rows:
            pos = (entry.partition, entry.offset)
            first[entry.event_id] = min(first.get(entry.event_id, pos), pos)
    per_key: dict[tuple[str, str], list[tuple[tuple[int, int], int]]] = defaultdict(list)
    for eid, pos in first.items():
        row = rows[eid]
        per_key[(row.topic, row.key)].append((pos, row.id))
    for (topic, key), deliveries in per_key.items():
        ids = [oid for _, oid in sorted(deliveries)]
        if ids != sorted(ids):
            out.append(Violation(Invariant.ORDER, f"{topic}/{key}",
                                 f"outbox ids in offset order {ids}"))
    return out


@attrs.frozen
class Window:
    ledger: Ledger
    complete: bool  # every partition read past the end offset taken at the start
    why: str = ""   # when not complete


def entry_of(message: Any) -> Entry:
    headers = {k: v.decode(errors="replace") for k, v in (message.headers or ())}
    try:
        payload = json.loads(message.value)
    except (TypeError, ValueError):
        payload = None
    return Entry(message.topic, message.partition, message.offset,
                 message.key.decode(errors="replace") if message.key else None,
                 headers.get("event-id"), payload)


def message_bytes(message: Any) -> int:
    """What a consumed message weighs: its key, value and headers."""
    return (len(message.key or b"") + len(message.value or b"")
            + sum(len(k) + len(v or b"") for k, v in (message.headers or ())))


async def read_window(cfg: KafkaConfig, topics: Iterable[str], since_ms: int, *,
                      max_messages: int, timeout_s: float,
                      max_bytes: int = 256 * 1024 * 1024) -> Window:
    """Every message of *topics* from the offsets of *since_ms* to their end (asyncio: run
    it with ``asyncio.run``). Bounded by *max_messages*, *max_bytes* and *timeout_s*."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    deadline = time.monotonic() + timeout_s
    consumer = AIOKafkaConsumer(
        bootstrap_servers=cfg.bootstrap_servers, client_id=f"{cfg.client_id}-audit",
        enable_auto_commit=False, group_id=None, request_timeout_ms=int(timeout_s * 1000),
        fetch_max_bytes=min(max_bytes, 50 * 1024 * 1024),
        max_partition_fetch_bytes=min(max_bytes, 1024 * 1024), **client_security(cfg))
    await consumer.start()
    ledger = Ledger()
    read_bytes = 0
    try:
        tps = [TopicPartition(t, p) for t in topics
               for p in (await _partitions(consumer, t))]
        if not tps:
            return Window(ledger, True)
        consumer.assign(tps)
        ends = await consumer.end_offsets(tps)
        starts = await consumer.offsets_for_times(dict.fromkeys(tps, since_ms))
        todo = []
        for tp in tps:
            start = starts.get(tp)
            if start is None:  # nothing at or after since_ms
                continue
            consumer.seek(tp, start.offset)
            todo.append(tp)
        while todo:
            if time.monotonic() > deadline:
                return Window(ledger, False, f"topic read exceeded {timeout_s:g}s")
            batch = await consumer.getmany(*todo, timeout_ms=500)
            for messages in batch.values():
                read_bytes += sum(message_bytes(m) for m in messages)
                ledger.entries.extend(entry_of(m) for m in messages)
            if len(ledger.entries) > max_messages:
                return Window(ledger, False, f"window holds more than {max_messages} messages")
            if read_bytes > max_bytes:
                return Window(ledger, False, f"window holds more than {max_bytes} bytes")
            # done with a partition once past its end offset *and* a fetch came back empty:
            # some brokers (Tansu) answer a stale end offset
            todo = [tp for tp in todo
                    if batch.get(tp) or await consumer.position(tp) < ends[tp]]
        return Window(ledger, True)
    finally:
        await consumer.stop()


async def _partitions(consumer: Any, topic: str) -> set[int]:
    # a fresh consumer knows no topic yet: ask the cluster (aiokafka has no public call
    # that both fetches and keeps this metadata; ``topics()`` discards the partitions)
    cluster = await consumer._client.fetch_all_metadata()
    return set(cluster.partitions_for_topic(topic) or ())
