"""Test helpers that play the messenger service's part: they write the rows its happy path
would write, upload recordings the way the recorder does, and read Kafka topics.

Every function takes an open psycopg connection (autocommit) or a server object, so tests
compose them freely. Timestamps default to "now" on the database clock, shifted by the
``*_ago`` arguments (seconds).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import uuid
from collections.abc import Iterable
from typing import Any

import attrs
import psycopg
from psycopg.rows import dict_row

from supervision.dev.s3 import S3Server

BUCKET = "call-recordings"
PREFIX = "call-recordings/"


def new_id() -> str:
    return str(uuid.uuid4())


def db_now(conn: psycopg.Connection) -> dt.datetime:
    row = conn.execute("SELECT now()").fetchone()
    assert row is not None
    value: dt.datetime = row[0]
    return value


def ago(conn: psycopg.Connection, seconds: float | None) -> dt.datetime | None:
    if seconds is None:
        return None
    return db_now(conn) - dt.timedelta(seconds=seconds)


def insert_call_session(conn: psycopg.Connection, *, ended_ago: float | None = 3600,
                        status: str | None = None, chat_id: str | None = None) -> str:
    """A 1:1 call; ``ended_ago=None`` means it is still going on."""
    sid = new_id()
    ended = ago(conn, ended_ago)
    conn.execute(
        "INSERT INTO messenger.call_sessions (id, chat_id, deal_id, tenant_id, status,"
        " started_at, ended_at, created_at, updated_at)"
        " VALUES (%s, %s, %s, %s, %s, now() - interval '2 hours', %s,"
        " now() - interval '2 hours', now())",
        (sid, chat_id or new_id(), new_id(), new_id(),
         status or ("Ended" if ended else "Active"), ended))
    return sid


@attrs.frozen
class Recording:
    id: str
    session_id: str
    session_kind: str
    attempt_id: str | None


def insert_recording(conn: psycopg.Connection, *, session_id: str, status: str = "Uploading",
                     session_kind: str = "Direct", with_attempt: bool = True,
                     due_ago: float = 1.0, attempts: int = 0, chat_id: str | None = None,
                     file_id: str | None = None) -> Recording:
    """A call recording (and by default its Pending finalize row, due now)."""
    rid = new_id()
    available = status == "Available"
    conn.execute(
        "INSERT INTO messenger.call_recordings (id, session_kind, session_id, chat_id,"
        " deal_id, tenant_id, media_type, trigger, status, file_id, size_bytes,"
        " duration_seconds, format, started_at, ended_at, available_at, created_at, updated_at)"
        " VALUES (%s, %s, %s, %s, %s, %s, 'Audio', 'Manual', %s, %s, %s, %s, %s,"
        " now() - interval '2 hours', now() - interval '1 hour', %s,"
        " now() - interval '2 hours', now())",
        (rid, session_kind, session_id, chat_id or new_id(), new_id(), new_id(), status,
         file_id or (f"{PREFIX}{rid}" if available else None),
         1234 if available else None, 42 if available else None,
         "Ogg" if available else None, db_now(conn) if available else None))
    attempt_id = insert_attempt(conn, rid, session_id, session_kind, due_ago=due_ago,
                                attempts=attempts) if with_attempt else None
    return Recording(rid, session_id, session_kind, attempt_id)


def insert_attempt(conn: psycopg.Connection, recording_id: str, session_id: str,
                   session_kind: str = "Direct", *, due_ago: float = 1.0, attempts: int = 0,
                   status: str = "Pending") -> str:
    aid = new_id()
    conn.execute(
        "INSERT INTO messenger.recording_finalize_attempts (id, recording_id, session_kind,"
        " session_id, status, attempts, next_attempt_at, created_at, updated_at)"
        " VALUES (%s, %s, %s, %s, %s, %s, now() - %s * interval '1 second',"
        " now() - interval '1 hour', now())",
        (aid, recording_id, session_kind, session_id, status, attempts, due_ago))
    return aid


def upload_recording(s3: S3Server, recording_id: str, *, body: bytes = b"OggS" + b"\0" * 60,
                     content_type: str | None = "audio/ogg",
                     duration: str | None = "42", bucket: str = BUCKET) -> None:
    """What the recorder does: the binary with its metadata, at the conventional key."""
    metadata = {} if duration is None else {"duration-seconds": duration}
    s3.put_object(bucket, f"{PREFIX}{recording_id}", body, content_type, metadata)


def fetch(conn: psycopg.Connection, query: str, *params: Any) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(query, params).fetchall()  # type: ignore[arg-type]


def recording(conn: psycopg.Connection, rid: str) -> dict[str, Any]:
    (row,) = fetch(conn, "SELECT * FROM messenger.call_recordings WHERE id = %s", rid)
    return row


def attempt(conn: psycopg.Connection, rid: str) -> dict[str, Any]:
    (row,) = fetch(conn, "SELECT * FROM messenger.recording_finalize_attempts"
                         " WHERE recording_id = %s", rid)
    return row


def outbox_rows(conn: psycopg.Connection, dedupe_key: str | None = None) -> list[dict[str, Any]]:
    if dedupe_key is None:
        return fetch(conn, "SELECT * FROM messenger.integration_outbox ORDER BY id")
    return fetch(conn, "SELECT * FROM messenger.integration_outbox WHERE dedupe_key = %s"
                       " ORDER BY id", dedupe_key)


def realtime_rows(conn: psycopg.Connection, reference_id: str | None = None
                  ) -> list[dict[str, Any]]:
    if reference_id is None:
        return fetch(conn, "SELECT * FROM messenger.realtime_outbox ORDER BY id")
    return fetch(conn, "SELECT * FROM messenger.realtime_outbox WHERE reference_id = %s"
                       " ORDER BY id", reference_id)


# ---------------------------------------------------------------------------------- Kafka


def topic_end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    """Remember where a topic ends now, to read only what is produced after."""
    return asyncio.run(_end_offsets(bootstrap, topic))


async def _end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        parts = consumer.partitions_for_topic(topic) or set()
        if not parts:
            await consumer._client.force_metadata_update()
            parts = consumer.partitions_for_topic(topic) or {0}
        tps = [TopicPartition(topic, p) for p in parts]
        ends = await consumer.end_offsets(tps)
        return {tp.partition: off for tp, off in ends.items()}
    finally:
        await consumer.stop()


@attrs.frozen
class KafkaMessage:
    key: str | None
    value: dict[str, Any]
    headers: dict[str, str]
    partition: int
    offset: int


def read_topic(bootstrap: str, topic: str, since: dict[int, int] | None = None, *,
               expect: int | None = None, timeout: float = 10.0,
               **client: Any) -> list[KafkaMessage]:
    """Messages of *topic* after the offsets in *since* (default: from the start), until
    *expect* messages were read or nothing new arrives for a second (or *timeout*);
    *client* holds more consumer settings (``security_protocol``, ``ssl_context``)."""
    return asyncio.run(_read_topic(bootstrap, topic, since or {}, expect, timeout, client))


async def _read_topic(bootstrap: str, topic: str, since: dict[int, int], expect: int | None,
                      limit_s: float, client: dict[str, Any]) -> list[KafkaMessage]:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                **client)
    await consumer.start()
    out: list[KafkaMessage] = []
    try:
        parts = consumer.partitions_for_topic(topic)
        if not parts:
            await consumer._client.force_metadata_update()
            parts = consumer.partitions_for_topic(topic) or {0}
        tps = [TopicPartition(topic, p) for p in parts]
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, since.get(tp.partition, 0))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limit_s
        idle_since = loop.time()
        while loop.time() < deadline:
            batch = await consumer.getmany(timeout_ms=200)
            got = [m for msgs in batch.values() for m in msgs]
            if got:
                idle_since = loop.time()
            for m in got:
                out.append(KafkaMessage(
                    m.key.decode() if m.key else None, json.loads(m.value),
                    {k: v.decode() for k, v in m.headers}, m.partition, m.offset))
            if expect is not None and len(out) >= expect:
                break
            if expect is None and loop.time() - idle_since > 1.0:
                break
    finally:
        await consumer.stop()
    return out


def ids(rows: Iterable[dict[str, Any]], key: str = "id") -> list[str]:
    return [str(r[key]) for r in rows]


# ---- conferences (conference-reaper)


@attrs.frozen
class Conference:
    id: str
    chat_id: str
    deal_id: str
    tenant_id: str | None
    started_by_user_id: str


@attrs.frozen
class Participant:
    """A roster row; times are seconds before now on the database clock."""

    user_id: str = attrs.field(factory=new_id)
    role: str = "Participant"
    joined_ago: float = 900.0
    left_ago: float | None = 600.0


def insert_conference(conn: psycopg.Connection, *, status: str = "Active",
                      last_activity_ago: float = 3600.0, created_ago: float | None = None,
                      started_ago: float | None = None, started_at: dt.datetime | None = None,
                      active_participants: int = 0,
                      participants: int | Iterable[Participant] = 0,
                      peak: int | None = None, media_type: str = "Video",
                      tenant_id: str | None = "new") -> Conference:
    """A conference as the messenger service leaves it; ``participants`` is a count (a Host
    then Participants, all gone) or explicit rows. Active rooms started 10 minutes before
    their last activity unless told; Provisioning ones have no started_at."""
    now = db_now(conn)
    if started_ago is None and started_at is None and status != "Provisioning":
        started_ago = last_activity_ago + 600
    if started_at is None and started_ago is not None:
        started_at = now - dt.timedelta(seconds=started_ago)
    if created_ago is None:
        created_ago = max(last_activity_ago, started_ago or 0.0) + 60
    if isinstance(participants, int):
        roster = [Participant(role="Host" if n == 0 else "Participant",
                              joined_ago=created_ago - 30 - n, left_ago=last_activity_ago)
                  for n in range(participants)]
    else:
        roster = list(participants)
    conf = Conference(new_id(), new_id(), new_id(),
                      new_id() if tenant_id == "new" else tenant_id, new_id())
    conn.execute(
        "INSERT INTO messenger.conference_sessions (id, chat_id, deal_id, tenant_id,"
        " media_type, status, started_by_user_id, created_at, started_at, last_activity_at,"
        " active_participant_count, peak_participant_count, updated_at)"
        " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
        (conf.id, conf.chat_id, conf.deal_id, conf.tenant_id, media_type, status,
         conf.started_by_user_id, now - dt.timedelta(seconds=created_ago), started_at,
         now - dt.timedelta(seconds=last_activity_ago), active_participants,
         len(roster) if peak is None else peak, now))
    for p in roster:
        conn.execute(
            "INSERT INTO messenger.conference_participants (conference_id, user_id, role,"
            " joined_at, left_at) VALUES (%s, %s, %s, %s, %s)",
            (conf.id, p.user_id, p.role, now - dt.timedelta(seconds=p.joined_ago),
             None if p.left_ago is None else now - dt.timedelta(seconds=p.left_ago)))
    return conf


def insert_conference_recording(conn: psycopg.Connection, conference: Conference, *,
                                status: str = "Recording", created_ago: float = 300.0) -> str:
    """A recording of *conference* (no finalize row: that is recording-finalize's part)."""
    rid = new_id()
    conn.execute(
        "INSERT INTO messenger.call_recordings (id, session_kind, session_id, chat_id,"
        " deal_id, tenant_id, media_type, trigger, status, started_at, created_at, updated_at)"
        " VALUES (%s, 'Conference', %s, %s, %s, %s, 'Video', 'Manual', %s,"
        " now() - %s * interval '1 second', now() - %s * interval '1 second', now())",
        (rid, conference.id, conference.chat_id, conference.deal_id, conference.tenant_id,
         status, created_ago, created_ago))
    return rid


def conference(conn: psycopg.Connection, cid: str) -> dict[str, Any]:
    (row,) = fetch(conn, "SELECT * FROM messenger.conference_sessions WHERE id = %s", cid)
    return row


def conference_statuses(conn: psycopg.Connection) -> dict[str, tuple[str, str | None]]:
    """(status, end_reason) of every conference, by id."""
    rows = fetch(conn, "SELECT id, status, end_reason FROM messenger.conference_sessions")
    return {str(r["id"]): (r["status"], r["end_reason"]) for r in rows}


def skip_backoff(dsn: str) -> None:
    """The back-off has elapsed: every Pending finalize row is due now (the state a cycle
    waits for, set directly instead of sleeping it out)."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("UPDATE messenger.recording_finalize_attempts SET next_attempt_at = now()"
                  " WHERE status = 'Pending' AND next_attempt_at > now()")
