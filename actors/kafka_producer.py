"""aiokafka on the asyncio side of the bridge: one crossing per *wave* of messages.

>>> producer = KafkaProducer(cfg.kafka)
>>> await producer.start()                      # from Trio
>>> results = await producer.send_wave(msgs)    # one bridge crossing for the whole wave

``acks="all"`` without idempotence (Tansu and some brokers lack it), compression off by
default, one in-flight batch per partition (aiokafka's own rule, which keeps per-partition
order). Every message's outcome is reported separately: acknowledged, transient failure
(retry later) or permanent rejection (dead-letter).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import attrs
from aiokafka import AIOKafkaProducer
from aiokafka.errors import (
    InvalidTopicError,
    KafkaError,
    MessageSizeTooLargeError,
    TopicAuthorizationFailedError,
)

from supervision.bridge import run_asyncio
from supervision.config import KafkaConfig

PERMANENT = (MessageSizeTooLargeError, InvalidTopicError, TopicAuthorizationFailedError)


@attrs.frozen
class OutMessage:
    outbox_id: int
    topic: str
    key: bytes
    value: bytes
    headers: tuple[tuple[str, bytes], ...]


@attrs.frozen
class SendResult:
    outbox_id: int
    ok: bool
    permanent: bool = False
    error: str | None = None


def _error_code(exc: BaseException) -> str:
    return type(exc).__name__


class KafkaProducer:
    """A started-on-demand aiokafka producer driven from Trio."""

    def __init__(self, cfg: KafkaConfig, *, request_timeout_s: float = 10.0,
                 max_request_size: int = 1_048_576) -> None:
        self._cfg = cfg
        self._timeout_ms = int(request_timeout_s * 1000)
        self.max_request_size = max_request_size
        self._producer: AIOKafkaProducer | None = None

    @property
    def started(self) -> bool:
        return self._producer is not None

    async def start(self) -> None:
        await run_asyncio(self._start)

    async def _start(self) -> None:
        producer = AIOKafkaProducer(
            bootstrap_servers=self._cfg.bootstrap_servers, client_id=self._cfg.client_id,
            acks="all", enable_idempotence=False, compression_type=None, linger_ms=0,
            request_timeout_ms=self._timeout_ms, max_request_size=self.max_request_size,
            max_batch_size=256 * 1024,
        )
        try:
            await producer.start()
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
        pending: list[tuple[OutMessage, asyncio.Future[object] | BaseException]] = []
        for msg in messages:
            try:
                fut = await self._producer.send(msg.topic, msg.value, key=msg.key,
                                                headers=list(msg.headers))
                pending.append((msg, fut))
            except KafkaError as exc:  # client-side rejection (too large, bad topic)
                pending.append((msg, exc))
        results = []
        for msg, fut_or_exc in pending:
            failure = fut_or_exc if isinstance(fut_or_exc, BaseException) else None
            if failure is None:
                assert isinstance(fut_or_exc, asyncio.Future)
                try:
                    await fut_or_exc
                except KafkaError as err:
                    failure = err
            if failure is None:
                results.append(SendResult(msg.outbox_id, True))
            else:
                results.append(SendResult(msg.outbox_id, False,
                                          permanent=isinstance(failure, PERMANENT),
                                          error=_error_code(failure)))
        return results
