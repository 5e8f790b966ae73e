"""Incident-scoped actions (issue #38 item 3): a filter, its preview, its snapshot acted on
page by page.

>>> f = parse_filter(Verb.REQUEUE, {"since": "2h", "status": "Quarantined",
...                                  "error": "s3:http_503*"})
>>> seen = preview(conn, f)                   # the count, a sample, the frozen ids
>>> seen.count, seen.sample[0]["id"], seen.capped
(240, '9d7c…', False)
>>> done = act_page(conn, who, f, seen.pages()[0], "INC-42", "bucket policy fixed",
...                 page=1, pages=len(seen.pages()), total=seen.count)

A filter names a verb (``requeue``, ``replay``, ``release``) and what narrows its rows: a
time range (``since``, ``until``: a duration back from now or an ISO date/time), a status
(requeue: ``Quarantined`` or ``Pending``), an error pattern (``last_error`` of a finalize
row, the reason of a dead letter or a poison conference: case-insensitive, ``*`` any run
of characters, otherwise literal), and for a replay a topic and a key prefix. Each field is
parsed strictly: :class:`BadFilter` names the field (a field the verb has no use for is
refused, not ignored).

:func:`preview` reads the matching rows through one index (named SQL in
``supervision/app/sql/incidents.sql``), examining at most :data:`EXAMINE_MAX` rows of the
time range and freezing at most :data:`SNAPSHOT_MAX` ids. :func:`act_page` acts on one page
of those ids (at most :data:`PAGE_SIZE`) through the console's snapshot actions
(:mod:`supervision.app.actions`): each id re-checked under ``FOR UPDATE`` to be still as
the filter saw it, the ones that moved on skipped and named, nothing that arrived after
the preview touched. Each page is one transaction with its own trail row naming the
incident, the filter and the page (``page``/``pages``/``total``).
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping
from typing import Any

import attrs
import psycopg
from psycopg.rows import dict_row

from supervision.app import actions
from supervision.app.queries import ALL_QUERIES
from supervision.app.trail import Actor, Verb

VERBS = (Verb.REQUEUE, Verb.REPLAY, Verb.RELEASE)
STATUSES = ("Quarantined", "Pending")
SNAPSHOT_MAX = 10_000  # ids one preview freezes
EXAMINE_MAX = 50_000  # rows of the time range one preview reads at most
PAGE_SIZE = 200  # ids one request (one transaction, one trail row) acts on
SAMPLE = 20  # rows a preview shows
MAX_PATTERN = 200
MAX_INCIDENT = 200
FIELDS = {Verb.REQUEUE: ("since", "until", "status", "error"),
          Verb.REPLAY: ("since", "until", "error", "topic", "key_prefix"),
          Verb.RELEASE: ("since", "until", "error")}
ALL_FIELDS = ("since", "until", "status", "error", "topic", "key_prefix")
_QUERY = {(Verb.REQUEUE, "Quarantined"): "incident_finalize_quarantined",
          (Verb.REQUEUE, "Pending"): "incident_finalize_pending",
          (Verb.REPLAY, None): "incident_dead_letters",
          (Verb.RELEASE, None): "incident_poison"}
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class BadFilter(ValueError):
    """A filter field that does not parse; ``str()`` names the field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


@attrs.frozen
class Filter:
    verb: Verb
    since: dt.datetime | None = None
    until: dt.datetime | None = None
    status: str | None = None  # requeue only
    error: str | None = None  # the pattern as given
    topic: str | None = None  # replay only
    key_prefix: str | None = None  # replay only

    def as_json(self) -> dict[str, Any]:
        """The filter as the trail records it (only the fields given)."""
        out = {k: (v.isoformat() if isinstance(v, dt.datetime) else v)
               for k, v in attrs.asdict(self).items() if v is not None}
        return {**out, "verb": self.verb.value}

    def describe(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.as_json().items() if k != "verb")


def parse_filter(verb: Verb | str, given: Mapping[str, str | None]) -> Filter:
    """*given* (form fields or CLI options; empty and None mean "not given") parsed as a
    filter of *verb*, or :class:`BadFilter` naming the first bad field."""
    if verb not in VERBS:
        raise BadFilter("verb", f"must be one of {', '.join(VERBS)}, got {_show(str(verb))}")
    verb = Verb(verb)
    texts = {k: (v or "").strip() for k, v in given.items() if k in ALL_FIELDS}
    for name, text in texts.items():
        if text and name not in FIELDS[verb]:
            raise BadFilter(name, f"is not a filter of {verb.value} (its filters: "
                                  f"{', '.join(FIELDS[verb])})")
    since, until = _when("since", texts.get("since")), _when("until", texts.get("until"))
    if since and until and since >= until:
        raise BadFilter("until", "must be after since")
    status = None
    if verb is Verb.REQUEUE:
        status = texts.get("status") or ""
        if status not in STATUSES:
            raise BadFilter("status", f"must be one of {', '.join(STATUSES)}, got "
                                      f"{_show(status)}")
    return Filter(verb, since, until, status, _text("error", texts.get("error"), MAX_PATTERN),
                  _text("topic", texts.get("topic"), 249),
                  _text("key_prefix", texts.get("key_prefix"), 400))


def parse_incident(text: str | None) -> str:
    """The incident's name (``INC-42``, "S3 outage 4 Dec"): required, printable, short."""
    name = _text("incident", text, MAX_INCIDENT)
    if not name:
        raise BadFilter("incident", "required: the incident's name, for the trail")
    return name


def _when(field: str, text: str | None) -> dt.datetime | None:
    from supervision.app.trail import parse_since

    if not text:
        return None
    try:
        return parse_since(text)
    except (ValueError, OverflowError):
        raise BadFilter(field, "must be a duration back from now (24h) or an ISO date/time "
                               f"after the year 1, got {_show(text)}") from None


def _text(field: str, text: str | None, limit: int) -> str | None:
    if not text:
        return None
    if len(text) > limit or _CONTROL.search(text):
        raise BadFilter(field, f"at most {limit} printable characters, got {_show(text)}")
    return text


def like_pattern(text: str | None) -> str | None:
    """The error pattern as an ILIKE pattern: ``*`` any run, everything else literal, a
    match anywhere in the text."""
    if text is None:
        return None
    literal = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return "%" + literal.replace("*", "%") + "%"


@attrs.frozen
class Preview:
    """What a filter matched at the preview: the ids frozen (at most
    :data:`SNAPSHOT_MAX`), a sample of the rows, and whether more matched."""

    filter: Filter
    ids: list[str]
    sample: list[dict[str, Any]]
    capped: bool  # more rows matched than the snapshot holds
    window_cut: bool  # the time range holds more than EXAMINE_MAX rows: narrow it

    @property
    def count(self) -> int:
        return len(self.ids)

    def pages(self, size: int = PAGE_SIZE) -> list[list[str]]:
        return [self.ids[i:i + size] for i in range(0, len(self.ids), size)]


def preview(conn: psycopg.Connection, f: Filter, limit: int = SNAPSHOT_MAX) -> Preview:
    """The rows *f* matches now (read only, nothing locked)."""
    name = _QUERY[(f.verb, f.status if f.verb is Verb.REQUEUE else None)]
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(ALL_QUERIES[name], {
            "since": f.since, "until": f.until, "pattern": like_pattern(f.error),
            "topic": f.topic, "key_prefix": f.key_prefix, "examine": EXAMINE_MAX,
            "limit": limit + 1}).fetchall()
    examined = int(rows[0]["examined"]) if rows else 0
    return Preview(f, [r["id"] for r in rows[:limit]],
                   [{k: v for k, v in r.items() if k != "examined"} for r in rows[:SAMPLE]],
                   len(rows) > limit, examined >= EXAMINE_MAX)


def trail_note(f: Filter, incident: str, *, page: int, pages: int, total: int,
               snapshot: str | None = None) -> dict[str, Any]:
    """What each page's trail row says beside the action's own result."""
    return {"incident": incident, "filter": f.as_json(), "page": page, "pages": pages,
            "total": total, **({"snapshot": snapshot} if snapshot else {})}


def act_page(conn: psycopg.Connection, who: Actor, f: Filter, ids: list[str],
             incident: str, reason: str, *, page: int, pages: int, total: int,
             snapshot: str | None = None) -> actions.Done[Any]:
    """Act on one page of a preview's ids (each re-checked under lock), in one transaction
    with its trail row."""
    if len(ids) > PAGE_SIZE:
        raise ValueError(f"a page is at most {PAGE_SIZE} ids, got {len(ids)}")
    note = trail_note(f, incident, page=page, pages=pages, total=total, snapshot=snapshot)
    if f.verb is Verb.REQUEUE:
        assert f.status is not None
        return actions.requeue_snapshot(conn, who, ids, reason, status=f.status, note=note)
    if f.verb is Verb.REPLAY:
        return actions.replay_snapshot(conn, who, ids, reason, note=note)
    return actions.release_snapshot(conn, who, ids, reason, note=note)


def _show(text: str) -> str:
    return repr(text if len(text) <= 64 else text[:64] + "…")
