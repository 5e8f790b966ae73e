"""aiokafka on the asyncio side of the bridge: one crossing per *wave* of messages.

>>> producer = KafkaProducer(cfg.kafka)
>>> await producer.start()                      # from Trio
>>> results = await producer.send_wave(msgs)    # one bridge crossing for the whole wave

``acks`` and idempotence from ``[kafka]`` (``acks = "all"`` without idempotence by
default: Tansu and some brokers refuse InitProducerId), compression off by default, one
in-flight batch per partition (aiokafka's own rule, which keeps per-partition order). A
wave's messages are packed into record batches, one per partition (aiokafka's
``create_batch``/``send_batch``; the partition is the one aiokafka's default partitioner
picks, :func:`key_partitioner`), so the whole wave is on the wire at once and each batch
has one acknowledgement to await, not one per message. A message larger than
``max_request_size`` is rejected before any batch, as ``send()`` would. A broker whose own
limit is lower (``message.max.bytes``) may refuse a whole batch as too large
(``MessageSizeTooLarge``, ``RecordListTooLarge``): its messages are then sent again one
per batch, so only a message too large on its own is rejected, not its batch-mates.

Security (TLS, SASL) comes from ``[kafka]`` through :mod:`actors.kafka.security`; a
broker that refuses the connection makes :meth:`KafkaProducer.start` raise
:class:`~supervision.errors.ConfigurationFault`.

Every message's outcome is reported separately as a :class:`Delivery`: acknowledged,
transient failure (retry later), rejected (dead-letter: that message can never be
published) or a configuration fault (the broker refuses *us* — authorization, SASL, a
topic that does not exist: nothing is the row's fault, retrying helps once fixed).

A topic the client has no metadata for is probed first, once per wave with one
``Metadata`` request for all such topics: aiokafka's own wait on an unknown topic (broker
auto-create off) loops for the whole request timeout per message and then raises an error
that a dead broker raises too. The probe's answer is immediate and unambiguous.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import ssl
from collections.abc import Sequence
from typing import Any, NamedTuple

import attrs
from aiokafka import AIOKafkaProducer
from aiokafka import errors as kafka_errors
from aiokafka.errors import (
    InvalidTopicError,
    KafkaConnectionError,
    KafkaError,
    LeaderNotAvailableError,
    MessageSizeTooLargeError,
    RecordListTooLargeError,
)
from aiokafka.partitioner import DefaultPartitioner, murmur2
from aiokafka.protocol.metadata import MetadataRequest
from aiokafka.record.default_records import DefaultRecordBatchBuilder

from actors.kafka.security import client_security, diagnose, refusal
from supervision.config import KafkaConfig
from supervision.errors import ConfigurationFault
from supervision.tree.bridge import run_asyncio

REJECTED = (MessageSizeTooLargeError, RecordListTooLargeError, InvalidTopicError)
# a batch the broker refuses whole for its size: its messages are sent again one by one,
# and only one that is too large on its own is rejected (dead-lettered)
TOO_LARGE = (MessageSizeTooLargeError, RecordListTooLargeError)
estimate_size_in_bytes = DefaultRecordBatchBuilder.estimate_size_in_bytes
MAX_REQUEST_SIZE = 1_048_576  # aiokafka's default; the outbox claim measures rows by it


class Delivery(enum.Enum):
    ACKED = "acked"
    TRANSIENT = "transient"  # retry the row later (broker down, timeout, leader moving)
    REJECTED = "rejected"  # this message can never be published: dead-letter it
    FAULT = "fault"  # a configuration fault: the row waits untouched until it is fixed


def classify(exc: BaseException) -> Delivery:
    """The outcome of a message that failed with *exc*.

    ``UnknownTopicOrPartitionError`` from a send is transient: aiokafka raises it after
    its metadata wait timed out, which a dead broker causes too. A missing topic is told
    apart by the topic probe, where the broker itself answers (:func:`probe_verdict`).
    A refusal of the connection itself (TLS, SASL: :func:`actors.kafka.security.refusal`)
    is a configuration fault too."""
    if refusal(exc) is not None:
        return Delivery.FAULT
    if isinstance(exc, REJECTED):
        return Delivery.REJECTED
    return Delivery.TRANSIENT


@attrs.define  # not frozen: built per outbox row, and a frozen __init__ costs twice
class OutMessage:
    outbox_id: int
    topic: str
    key: bytes
    value: bytes
    headers: tuple[tuple[str, bytes], ...]


class SendResult(NamedTuple):
    """One message's outcome (a tuple: built once per message on the relay's path, where
    a frozen attrs class's ``__init__`` cost a tenth of the logical source's Python)."""

    outbox_id: int
    delivery: Delivery
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.delivery is Delivery.ACKED


def probe_verdict(error_code: int) -> Delivery | None:
    """What a topic's error code in a ``Metadata`` answer means for its messages: None
    when they can be sent, else the outcome to report for each without sending it."""
    error = kafka_errors.for_code(error_code)
    if error is kafka_errors.NoError or error is LeaderNotAvailableError:  # being created
        return None
    if error is kafka_errors.UnknownTopicOrPartitionError:  # auto-create off
        return Delivery.FAULT
    return classify(error())


@functools.lru_cache(maxsize=16_384)
def _key_hash(key: bytes) -> int:
    return int(murmur2(key)) & 0x7FFFFFFF


def key_partitioner(key: bytes | None, all_partitions: list[int],
                    available: list[int]) -> int:
    """aiokafka's default partitioning — the Java client's murmur2 of the key, so a key
    lands on the partition other producers put it on — with the hashes of the last
    16,384 keys remembered: aiokafka's murmur2 is pure Python (20-50 µs for a 36-byte
    key, more than the rest of a send), and a key's events come close together."""
    if key is None:
        return int(DefaultPartitioner()(key, all_partitions, available))
    return all_partitions[_key_hash(key) % len(all_partitions)]


def _failed(msg: OutMessage, exc: BaseException) -> SendResult:
    return SendResult(msg.outbox_id, classify(exc), type(exc).__name__)


class KafkaProducer:
    """A started-on-demand aiokafka producer driven from Trio.

    *create_topics* is the ``allow_auto_topic_creation`` flag of the topic probe (the
    broker's ``auto.create.topics.enable`` still decides); False makes any broker behave
    like one with auto-create off."""

    def __init__(self, cfg: KafkaConfig, *, request_timeout_s: float = 10.0,
                 max_request_size: int = MAX_REQUEST_SIZE, create_topics: bool = True) -> None:
        self._cfg = cfg
        self._timeout_ms = int(request_timeout_s * 1000)
        self.max_request_size = max_request_size
        self.create_topics = create_topics
        self._producer: AIOKafkaProducer | None = None

    @property
    def started(self) -> bool:
        return self._producer is not None

    async def start(self) -> None:
        """Connect; :class:`ConfigurationFault` when the broker refuses us (an untrusted
        certificate, rejected credentials), else aiokafka's error (broker unreachable)."""
        await run_asyncio(self._start)

    async def _start(self) -> None:
        try:
            security = client_security(self._cfg)
        except (OSError, ssl.SSLError) as exc:  # a TLS file gone or changed since loading
            raise ConfigurationFault(f"TLS files cannot be loaded: {exc}") from exc
        producer = AIOKafkaProducer(
            bootstrap_servers=self._cfg.bootstrap_servers, client_id=self._cfg.client_id,
            acks=self._cfg.acks.aiokafka, enable_idempotence=self._cfg.enable_idempotence,
            compression_type=None, linger_ms=0,
            request_timeout_ms=self._timeout_ms, max_request_size=self.max_request_size,
            max_batch_size=256 * 1024, partitioner=key_partitioner, **security,
        )
        try:
            await producer.start()
        except Exception as exc:
            await producer.stop()
            cause: BaseException = exc
            if isinstance(exc, KafkaConnectionError):  # start() logs the real error only
                cause = await diagnose(self._cfg, self._timeout_ms) or exc
            reason = refusal(cause)
            if reason is not None:
                raise ConfigurationFault(f"broker refused the connection: {reason}") from exc
            raise
        except BaseException:
            await producer.stop()
            raise
        self._producer = producer

    async def stop(self) -> None:
        if self._producer is not None:
            producer, self._producer = self._producer, None
            await run_asyncio(producer.stop)

    async def send_wave(self, messages: Sequence[OutMessage]) -> list[SendResult]:
        """Send every message; wait for each acknowledgement or failure."""
        return await run_asyncio(self._send_wave, list(messages))

    async def _send_wave(self, messages: list[OutMessage]) -> list[SendResult]:
        assert self._producer is not None
        producer = self._producer
        unusable = await self._probe_topics({msg.topic for msg in messages})
        results: list[SendResult] = []
        batches: dict[tuple[str, int], list[tuple[Any, list[OutMessage]]]] = {}
        partitions: dict[str, list[int]] = {}
        for msg in messages:
            if msg.topic in unusable:
                delivery, error = unusable[msg.topic]
                results.append(SendResult(msg.outbox_id, delivery, error))
                continue
            headers = list(msg.headers)
            if estimate_size_in_bytes(msg.key, msg.value, headers) > self.max_request_size:
                results.append(_failed(msg, MessageSizeTooLargeError()))  # as send() would
                continue
            if (all_partitions := partitions.get(msg.topic)) is None:
                try:
                    all_partitions = sorted(await producer.partitions_for(msg.topic))
                except KafkaError as exc:  # no metadata within the request timeout
                    results.append(_failed(msg, exc))
                    continue
                partitions[msg.topic] = all_partitions
            tp = (msg.topic, key_partitioner(msg.key, all_partitions, all_partitions))
            open_batches = batches.setdefault(tp, [])
            if not open_batches or open_batches[-1][0].append(
                    timestamp=None, key=msg.key, value=msg.value, headers=headers) is None:
                builder = producer.create_batch()  # the first message always fits
                builder.append(timestamp=None, key=msg.key, value=msg.value, headers=headers)
                open_batches.append((builder, []))
            open_batches[-1][1].append(msg)
        submitted: list[tuple[asyncio.Future[object], list[OutMessage], tuple[str, int]]] = []
        for (topic, partition), builders in batches.items():
            for builder, batch in builders:
                try:
                    submitted.append((await producer.send_batch(builder, topic,
                                                                partition=partition), batch,
                                      (topic, partition)))
                except KafkaError as exc:  # no room in the accumulator in time, closed
                    results.extend(_failed(msg, exc) for msg in batch)
        for future, batch, tp in submitted:
            try:
                await future
            except TOO_LARGE as exc:
                if len(batch) == 1:
                    results.append(_failed(batch[0], exc))
                else:  # the broker refused the batch whole: find the message to blame
                    results.extend(await self._send_one_by_one(batch, *tp))
            except KafkaError as exc:
                results.extend(_failed(msg, exc) for msg in batch)
            else:
                results.extend(SendResult(msg.outbox_id, Delivery.ACKED) for msg in batch)
        return results

    async def _send_one_by_one(self, batch: list[OutMessage], topic: str,
                               partition: int) -> list[SendResult]:
        """Each message of a batch the broker refused as too large, in a batch of its own
        and in order (the wave holds one message per key, so order across them is free;
        one at a time keeps the retry's load to one message in flight)."""
        assert self._producer is not None
        results: list[SendResult] = []
        for msg in batch:
            builder = self._producer.create_batch()
            builder.append(timestamp=None, key=msg.key, value=msg.value,
                           headers=list(msg.headers))
            try:
                await (await self._producer.send_batch(builder, topic, partition=partition))
            except KafkaError as exc:
                results.append(_failed(msg, exc))
            else:
                results.append(SendResult(msg.outbox_id, Delivery.ACKED))
        return results

    async def _probe_topics(self, topics: set[str]) -> dict[str, tuple[Delivery, str]]:
        """Ask the broker about the topics the client has no metadata for; the verdict
        and error name of each one that cannot be sent to now (a missing topic, no
        authorization, a broker that does not answer)."""
        assert self._producer is not None
        client = self._producer.client
        unknown = sorted(t for t in topics if client.cluster.partitions_for_topic(t) is None)
        if not unknown:
            return {}
        node = client.get_random_node()
        if node is None:
            return dict.fromkeys(unknown, (Delivery.TRANSIENT, "NoBrokerAvailable"))
        request = MetadataRequest(unknown, allow_auto_topic_creation=self.create_topics)
        try:
            response = await client.send(node, request)
        except KafkaError as exc:
            return dict.fromkeys(unknown, (Delivery.TRANSIENT, type(exc).__name__))
        verdicts: dict[str, tuple[Delivery, str]] = {}
        for topic_data in response.topics:
            error_code, topic = topic_data[0], topic_data[1]
            delivery = probe_verdict(error_code)
            if delivery is not None:
                verdicts[topic] = (delivery, kafka_errors.for_code(error_code).__name__)
        return verdicts
