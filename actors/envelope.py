"""The event envelope every job publishes in: topics, event ids, headers, the database clock.

Shared by the jobs that write the outbox (finalize, reaper), the relay that reads it and
the audit that checks what Kafka holds. An event id is a UUIDv5 of (topic, dedupe key), so
a re-emit of the same fact carries the same id and consumers drop the duplicate; headers
are the SPEC's five, as a JSON object stored beside the payload in the outbox row.
Every "now" a verdict uses is the database's (:func:`db_now`), never this host's clock.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid

import psycopg

from supervision.db.queries import QUERIES

TOPIC_RECORDING_AVAILABLE = "pin.messenger.call-recording-available.v1"
TOPIC_CONFERENCE_ENDED = "pin.messenger.conference-ended.v1"
EVENT_NAMESPACE = uuid.UUID("6f1c1f63-29a4-4c59-9d53-6b8b3c1e5a10")


def event_id(topic: str, dedupe_key: str) -> str:
    """The event id of (topic, dedupe key): the same on every re-emit."""
    return str(uuid.uuid5(EVENT_NAMESPACE, f"{topic}\n{dedupe_key}"))


def event_header_fields(topic: str, dedupe_key: str, event_type: str, job_run_id: str,
                        source: str) -> dict[str, str]:
    """The SPEC's event headers of one event."""
    return {
        "event-type": event_type, "event-id": event_id(topic, dedupe_key),
        "correlation-id": job_run_id, "source": source, "content-type": "application/json",
    }


def event_headers(topic: str, dedupe_key: str, event_type: str, job_run_id: str,
                  source: str) -> str:
    """The headers of one event as the outbox stores them (a JSON object)."""
    return json.dumps(event_header_fields(topic, dedupe_key, event_type, job_run_id, source))


def db_now(conn: psycopg.Connection) -> dt.datetime:
    """The database's clock: the one "now" every verdict is taken against."""
    row = conn.execute(QUERIES["db_now"]).fetchone()
    assert row is not None
    value: dt.datetime = row[0]
    return value
