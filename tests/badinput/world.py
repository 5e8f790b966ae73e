"""A fresh database with healthy rows of every kind, the servers around it, and the
invariant check over everything but the planted bad subjects.

A bad-input case plants its input into a :class:`World`, runs the job, and afterwards
every *other* row must have reached its terminal state (``tests.chaos.checker``).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import psycopg

from actors.envelope import event_id
from supervision.app.daemon import run_once
from supervision.app.settings import Config
from supervision.dev.kafka import KafkaServer
from supervision.dev.s3 import S3Server
from tests.chaos.checker import Limits, Violation, check, summary
from tests.conftest import make_config
from tests.faults import FaultProxy, put_recordings
from tests.media_stub import MediaStub
from tests.messenger import (
    PREFIX,
    insert_attempt,
    insert_call_session,
    insert_conference,
    insert_conference_recording,
    insert_recording,
)

# no Kafka ledger is read here (the relay's delivery is the chaos suite's subject)
UNCHECKED = ("not_in_ledger", "ledger_inconsistent", "unknown_event", "order")
# the limits of make_config (finalize_sla_timeout 30m) and the reaper's defaults
LIMITS = Limits(sla_s=1800, max_attempts=8, empty_room_grace_s=90, provision_timeout_s=120,
                stale_live_timeout_s=4 * 3600)


@attrs.define
class World:
    dsn: str
    conn: psycopg.Connection
    s3: S3Server
    bucket: str
    proxy: FaultProxy
    media: MediaStub
    kafka: KafkaServer | None = None
    topic: str = attrs.field(factory=lambda: f"badinput.{uuid.uuid4().hex[:10]}")
    uploaded: set[str] = attrs.field(factory=set)   # recordings whose binary exists
    exempt: set[str] = attrs.field(factory=set)     # the bad subjects
    known: str = ""                                 # an Available recording in S3

    def config(self, **sections: dict[str, Any]) -> Config:
        """The test servers, S3 through the fault proxy; *sections* override keys."""
        s3 = {"endpoint_url": self.proxy.url, **sections.pop("s3", {})}
        media = {"base_url": self.media.base_url, "timeout": "0.5s",
                 **sections.pop("media", {})}
        return make_config(self.dsn, s3_server=self.s3, bucket=self.bucket,
                           kafka_server=self.kafka, s3=s3, media=media, **sections)

    # ------------------------------------------------------------------ healthy rows

    async def upload(self, *recording_ids: str, **kwargs: Any) -> None:
        await put_recordings(self.s3, self.bucket, recording_ids, **kwargs)
        self.uploaded.update(recording_ids)

    async def seed_recordings(self) -> None:
        """What production looks like: a recording finalised earlier (the positive
        canary's reference), two lost callbacks with their binary, one without."""
        known = insert_recording(self.conn, session_id=insert_call_session(self.conn),
                                 status="Available", with_attempt=False).id
        insert_attempt(self.conn, known, str(uuid.uuid4()), status="Done")
        sid = insert_call_session(self.conn)
        found = [insert_recording(self.conn, session_id=sid).id for _ in range(2)]
        insert_recording(self.conn, session_id=sid)
        await self.upload(known, *found)
        self.known = known
        self.exempt.add(known)  # finalised "earlier": its event rows are not seeded

    def seed_conferences(self) -> None:
        """Two empty rooms past their grace, each with a running recording to stop."""
        for n in range(2):
            room = insert_conference(self.conn, last_activity_ago=120 + n, participants=2)
            insert_conference_recording(self.conn, room)

    def seed_outbox(self, topic: str | None = None) -> list[int]:
        return [self.enqueue(topic or self.topic, key, {"N": n}, None)
                for n, key in enumerate(["a", "b", "c"])]

    def enqueue(self, topic: str, key: str, payload: Any, headers: Any,
                raw: bool = False) -> int:
        """An outbox row as another writer leaves it (*raw*: JSON text as given)."""
        dedupe = str(uuid.uuid4())
        if headers is None:
            headers = {"event-type": "Test", "event-id": event_id(topic, dedupe),
                       "source": "tests", "content-type": "application/json"}
        row = self.conn.execute(
            "INSERT INTO messenger.integration_outbox (topic, message_key, dedupe_key,"
            " event_type, payload, headers) VALUES (%s, %s, %s, 'Test', %s, %s) RETURNING id",
            (topic, key, dedupe, payload if raw else json.dumps(payload),
             headers if raw else json.dumps(headers))).fetchone()
        assert row is not None
        return int(row[0])

    # ------------------------------------------------------------------------ checks

    def violations(self, *, relay: bool) -> tuple[dict[str, int], list[Violation]]:
        """The invariants over every row but the exempt ones, and what broke them."""
        found = [v for v in check(self.dsn, uploaded=self.uploaded, limits=LIMITS,
                                  relay=relay)
                 if v.subject not in self.exempt]
        invariants = summary(found)
        for name in (*UNCHECKED, *(() if relay else ("unpublished",))):
            invariants.pop(name)
        return invariants, found


async def cycle(cfg: Config, job: str) -> str:
    """One ``run_once`` of *job*; its counts, or how the run failed (as run-once would)."""
    try:
        counts = await run_once(cfg, job)
    except Exception as exc:  # recorded as the run's outcome, as run-once reports it
        return "run-once failed: " + "; ".join(
            f"{type(e).__name__}: {e}" for e in _leaves(exc))
    return json.dumps({k: v for k, v in counts.items() if v and k != "duration_ms"},
                      sort_keys=True)


def _leaves(group: BaseException) -> list[BaseException]:
    if isinstance(group, BaseExceptionGroup):
        return [leaf for e in group.exceptions for leaf in _leaves(e)]
    return [group]


Plant = Callable[[World], Awaitable["Planted"]]


@attrs.define
class Planted:
    """What a case planted: the bad subject, the configuration to run with, and how to
    fix the cause afterwards (a configuration fault heals once fixed)."""

    subject: str = ""
    config: dict[str, Any] = attrs.field(factory=dict)
    heal: Callable[[], Awaitable[None]] | None = None
    extra: dict[str, Any] = attrs.field(factory=dict)


__all__ = ["LIMITS", "PREFIX", "Plant", "Planted", "World", "cycle"]
