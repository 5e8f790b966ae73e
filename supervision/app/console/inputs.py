"""What an operator types or a page's link carries, parsed strictly (issue #38 item 4).

Each parser returns the value or raises :class:`BadInput` naming the field, and the console
shows the form (or the page) again with that error (400): never a 500, never a silent
default (a pause "for 2 hours" is refused, not turned into an indefinite pause), and an id
is the type it names (``'²'.isdigit()`` is true, but ``²`` is no outbox id).

>>> outbox_ids(["12", "7"])
[12, 7]
>>> pause_for("2 hours")
Traceback (most recent call last):
...
supervision.app.console.inputs.BadInput: for: malformed duration '2 hours' (use e.g. ...)
"""

from __future__ import annotations

import datetime as dt
import math
import re
import urllib.parse
import uuid
from collections.abc import Collection, Mapping, Sequence

from starlette.datastructures import FormData, UploadFile
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from supervision.app.incidents import BadFilter, Filter, parse_filter, parse_incident
from supervision.durations import format_duration, parse_duration

BIGINT_MAX = 2**63 - 1
MAX_FORM_BYTES = 64 * 1024  # a form: at most one page of ids, a reason and a few fields
MAX_FORM_FIELDS = 200
FORM_TYPE = "application/x-www-form-urlencoded"
MAX_PAUSE_S = 366 * 86400.0
_DIGITS = re.compile(r"[0-9]{1,19}")  # ASCII only: str.isdigit() takes '²' and '٣'
_TOKEN = re.compile(r"[A-Za-z0-9_-]{24}")  # secrets.token_urlsafe(18)


class BadInput(ValueError):
    """An input that does not parse; ``str()`` names the field and what it must be."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


def whole(text: str, field: str) -> int:
    """A positive database id (bigint), in ASCII digits."""
    if not _DIGITS.fullmatch(text) or not 0 < int(text) <= BIGINT_MAX:
        raise BadInput(field, f"must be a whole number from 1 to {BIGINT_MAX}, got "
                              f"{_show(text)}")
    return int(text)


def optional_whole(params: Mapping[str, str], field: str) -> int | None:
    text = params.get(field)
    return None if text is None or text == "" else whole(text, field)


def choice(params: Mapping[str, str], field: str, allowed: Collection[str],
           default: str) -> str:
    text = params.get(field)
    if text is None or text == "":
        return default
    if text not in allowed:
        raise BadInput(field, f"must be one of {', '.join(allowed)}, got {_show(text)}")
    return text


def outbox_ids(ids: Sequence[str]) -> list[int]:
    return [whole(i, "ids") for i in ids]


def uuids(ids: Sequence[str]) -> list[str]:
    out = []
    for text in ids:
        try:
            out.append(str(uuid.UUID(text)))
        except ValueError:
            raise BadInput("ids", f"must be UUIDs, got {_show(text)}") from None
    return out


def since(text: str) -> dt.datetime | None:
    """The history's ``since``: a duration back from now (``24h``) or an ISO date/time."""
    from supervision.app.trail import parse_since

    if not text:
        return None
    try:
        return parse_since(text)
    except (ValueError, OverflowError):
        raise BadInput("since", "must be a duration back from now (24h) or an ISO date/time"
                                f" after the year 1, got {_show(text)}") from None


def pause_for(text: str) -> float | None:
    """A pause's "for": empty (until resumed) or a duration up to :data:`MAX_PAUSE_S`."""
    if not text:
        return None
    try:
        seconds = parse_duration(text)
    except ValueError as exc:
        raise BadInput("for", str(exc)) from None
    if not (math.isfinite(seconds) and 0 < seconds <= MAX_PAUSE_S):
        raise BadInput("for", f"must be more than 0s and at most "
                              f"{format_duration(MAX_PAUSE_S)} (leave it empty to pause "
                              f"until resumed), got {_show(text)}")
    return seconds


async def read_form(request: Request) -> FormData | Response:
    """A small urlencoded form, read at most :data:`MAX_FORM_BYTES` (no multipart: nothing
    is spooled to disk)."""
    kind = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if kind != FORM_TYPE:
        return PlainTextResponse(f"only {FORM_TYPE} forms are accepted", 415)
    declared = request.headers.get("content-length", "")
    if declared.isascii() and declared.isdigit() and int(declared) > MAX_FORM_BYTES:
        return PlainTextResponse(f"a form is at most {MAX_FORM_BYTES} bytes", 413)
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            return PlainTextResponse(f"a form is at most {MAX_FORM_BYTES} bytes", 413)
    try:
        pairs = urllib.parse.parse_qsl(body.decode("latin-1"), keep_blank_values=True,
                                       encoding="utf-8", errors="replace",
                                       max_num_fields=MAX_FORM_FIELDS)
    except ValueError:
        return PlainTextResponse(f"a form has at most {MAX_FORM_FIELDS} fields", 413)
    return FormData(list[tuple[str, str | UploadFile]](pairs))


def _show(text: str) -> str:
    return repr(text if len(text) <= 64 else text[:64] + "…")


def incident_filter(fields: Mapping[str, str]) -> tuple[Filter, str]:
    """An incident form's verb, filter and incident name (:mod:`supervision.app.incidents`),
    or :class:`BadInput` naming the field."""
    verb = fields.get("verb", "")
    try:
        f = parse_filter(verb, fields)
        return f, parse_incident(fields.get("incident"))
    except BadFilter as exc:
        raise BadInput(exc.field, str(exc).partition(": ")[2]) from None


def snapshot_page(fields: Mapping[str, str]) -> tuple[str, int]:
    """An incident act's snapshot token and page number."""
    token = fields.get("snapshot", "")
    if not _TOKEN.fullmatch(token):
        raise BadInput("snapshot", "not a snapshot of this console: preview again")
    return token, whole(fields.get("page", ""), "page")
