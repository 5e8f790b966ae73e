"""The console's incident-scoped actions: a filter, its preview, its snapshot acted on
page by page (issue #38 item 3; :mod:`supervision.app.incidents` does the work).

``GET /incident?verb=requeue`` is the filter's form; ``POST /incident/preview`` (token-bound)
shows how many rows the filter matches and a sample, freezes their ids server-side
(:mod:`supervision.app.console.snapshots`) and asks for the reason; each ``POST
/incident/act`` (``confirm=yes``, the snapshot's token, the page it acts on) acts on one
page of exactly those ids, each re-checked under lock, and shows what changed, what was
skipped and the button for the next page. A bad field shows the form again with the error
naming it (400).
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

from supervision.app import incidents
from supervision.app.console import inputs
from supervision.app.console.inputs import BadInput
from supervision.app.console.snapshots import Snapshot, Snapshots
from supervision.app.trail import Actor, Verb

Form = Callable[[Request], Awaitable[tuple[dict[str, Any], list[str]] | Response]]
Render = Callable[..., HTMLResponse]


class IncidentPages:
    def __init__(self, *, render: Render, form: Form, run: Callable[..., Awaitable[Any]],
                 who: Callable[[Request], Actor], unavailable: type[Exception]) -> None:
        self.render, self.form, self.run, self.who = render, form, run, who
        self.unavailable = unavailable
        self.kept = Snapshots()

    def _filter_form(self, request: Request, fields: dict[str, Any], error: str = "",
                     status: int = 200) -> Response:
        given = str(fields.get("verb", ""))
        verb = Verb(given) if given in incidents.VERBS else Verb.REQUEUE
        return self.render(request, "incident.html", {
            "verb": verb.value, "fields": fields, "error": error,
            "filters": incidents.FIELDS[verb],
            "statuses": incidents.STATUSES, "verbs": incidents.VERBS}, status=status)

    async def filter_page(self, request: Request) -> Response:
        """The filter's form (a GET: it changes nothing)."""
        fields = {k: v for k, v in request.query_params.items() if k in ("verb",)}
        if fields.get("verb", "requeue") not in incidents.VERBS:
            return self._filter_form(request, fields, "verb: must be one of "
                                     + ", ".join(incidents.VERBS), 400)
        return self._filter_form(request, fields)

    async def preview(self, request: Request) -> Response:
        parsed = await self.form(request)
        if isinstance(parsed, Response):
            return parsed
        fields = parsed[0]
        try:
            f, incident = inputs.incident_filter(fields)
        except BadInput as exc:
            return self._filter_form(request, fields, str(exc), 400)
        try:
            seen = await self.run(incidents.preview, f)
        except self.unavailable as exc:
            return self.render(request, "unavailable.html", {"why": str(exc)}, status=503)
        snap = self.kept.put(request.state.user, seen, incident)
        return self._preview_page(request, snap)

    def _preview_page(self, request: Request, snap: Snapshot, error: str = "",
                      status: int = 200) -> Response:
        return self.render(request, "incident_preview.html", {
            "snap": snap, "seen": snap.preview, "pages": len(snap.pages),
            "page_size": incidents.PAGE_SIZE, "limit": incidents.SNAPSHOT_MAX,
            "examine": incidents.EXAMINE_MAX, "error": error}, status=status)

    async def act(self, request: Request) -> Response:
        parsed = await self.form(request)
        if isinstance(parsed, Response):
            return parsed
        fields = parsed[0]
        try:
            token, page = inputs.snapshot_page(fields)
        except BadInput as exc:
            return self._message(request, "incident: bad input", str(exc), 400)
        snap = self.kept.get(token, request.state.user)
        if snap is None:
            return self._message(request, "incident: preview again", "this snapshot is "
                                 "unknown here: it expired, was made by another login, or "
                                 "by a console that restarted since; preview again", 410)
        refused = self._refusal(request, snap, page, fields)
        if refused is not None:
            return refused
        return await self._act_page(request, snap, page)

    def _refusal(self, request: Request, snap: Snapshot, page: int,
                 fields: dict[str, Any]) -> Response | None:
        if snap.finished:
            return self._message(request, "incident: every page done", "every page of "
                                 "this snapshot was acted on: preview again for rows that "
                                 "match now", 409)
        if page != snap.next_page:
            return self._message(request, "incident: page already done" if page <
                                 snap.next_page else "incident: not that page",
                                 f"page {page}: the next page of this snapshot is "
                                 f"{snap.next_page} of {len(snap.pages)}", 409)
        reason = fields.get("reason", "").strip()[:1024] or snap.reason
        if fields.get("confirm") != "yes" or not reason:
            return self._preview_page(request, snap, "reason: required (recorded in "
                                      "the history with the incident)", 400)
        snap.reason = reason
        wait = self.kept.wait()
        if wait:
            busy = self._message(request, "incident: not so fast", "a page was acted on "
                                 "less than a second ago: press the button again", 429)
            busy.headers["retry-after"] = "1"
            return busy
        return None

    async def _act_page(self, request: Request, snap: Snapshot, page: int) -> Response:
        self.kept.start()
        try:
            done = await self.run(functools.partial(
                incidents.act_page, page=page, pages=len(snap.pages),
                total=snap.preview.count, snapshot=snap.token[:8]), self.who(request),
                snap.preview.filter, snap.pages[page - 1], snap.incident, snap.reason)
        except self.unavailable as exc:
            return self.render(request, "unavailable.html", {"why": str(exc)}, status=503)
        finally:
            self.kept.done()
        snap.record(page, done)
        return self.render(request, "incident_done.html", {
            "snap": snap, "done": done, "page": page, "pages": len(snap.pages)})

    def _message(self, request: Request, title: str, message: str, status: int
                 ) -> HTMLResponse:
        return self.render(request, "message.html", {"title": title, "message": message},
                           status=status)
