"""The console's routes: pages (GET, read-only) and actions (POST, confirmed, trailed).

>>> app = build_app(cfg, db)      # a Starlette app; `safetynet console` serves it on Trio

Actions are two POSTs: the first (from a list's form, with the ids the page showed) renders a
confirmation naming every id and asking for the reason; the second (``confirm=yes``, the
reason non-empty) acts through :mod:`supervision.app.actions` on exactly those ids. Both carry
the per-session token; with ``console.allow_actions`` false every action answers 403.

While PostgreSQL is down a page still renders, with what it could not show and why (503).
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any, TypeVar

import jinja2
import psycopg
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route

from actors.outbox.logical import source_of
from supervision.app import actions
from supervision.app.console import inputs, views
from supervision.app.console.audit_runs import AUDIT_MIN_INTERVAL_S, Audits
from supervision.app.console.daemon_metrics import scrape
from supervision.app.console.guard import Guard
from supervision.app.console.incident_pages import IncidentPages
from supervision.app.console.inputs import BadInput, read_form
from supervision.app.console.panels import chart_context
from supervision.app.console.security import (
    Gate,
    Site,
)
from supervision.app.frozen_keys import frozen_keys
from supervision.app.settings import Config
from supervision.app.terminal import printable
from supervision.app.trail import Actor, Origin, Verb, record_action
from supervision.db.database import Database
from supervision.errors import SafetynetError
from supervision.jobs import Job
from supervision.secrets import Scrubber, secrets_in

JOBS = tuple(Job)
STATUSES = ("Quarantined", "Pending")
MAX_IDS = views.PAGE  # a bulk action names at most one page of ids
T = TypeVar("T")

_templates = jinja2.Environment(
    loader=jinja2.PackageLoader("supervision.app.console", "templates"),
    autoescape=True, undefined=jinja2.StrictUndefined)
_CSS = (resources.files("supervision.app.console") / "static" / "console.css").read_bytes()


class Unavailable(Exception):
    """The database could not answer: the page says so and why."""


def build_app(cfg: Config, db: Database, gate: Gate | None = None) -> Starlette:
    gate = gate or Gate(cfg.console)
    console = _Console(cfg, db, gate)
    incident = IncidentPages(render=console.render, form=console._form, run=console._write,
                             who=console._who, unavailable=Unavailable)
    routes = [
        Route("/", console.overview), Route("/jobs/{job}", console.job),
        Route("/recordings", console.recordings),
        Route("/conferences", console.conferences), Route("/outbox", console.outbox),
        Route("/outbox/keys", console.frozen_keys),
        Route("/outbox/{row_id:int}", console.outbox_row), Route("/audit", console.audit),
        Route("/audit/run", console.run_audit, methods=["POST"]),
        Route("/history", console.history),
        Route("/static/console.css", console.css),
        *(Route(f"/actions/{name}", getattr(console, f"act_{name}"), methods=["POST"])
          for name in ("requeue", "release", "replay", "pause", "resume", "audit")),
        Route("/actions/release-key", console.act_release_key, methods=["POST"]),
        Route("/incident", incident.filter_page),  # incident-scoped actions, previewed
        Route("/incident/preview", incident.preview, methods=["POST"]),
        Route("/incident/act", incident.act, methods=["POST"]),
    ]
    return Starlette(routes=routes, middleware=[
        Middleware(Guard, gate=gate, site=Site.of(cfg.console))])


_Handler = Callable[["_Console", Request], Awaitable[Response]]


def _page(fn: _Handler) -> _Handler:
    """A page that renders "unavailable, because ..." (503) when the database cannot answer."""
    @functools.wraps(fn)
    async def page(self: _Console, request: Request) -> Response:
        try:
            return await fn(self, request)
        except Unavailable as exc:
            return self.render(request, "unavailable.html", {"why": str(exc)}, status=503)
        except BadInput as exc:
            return self.render(request, "message.html", {
                "title": "bad input", "message": str(exc)}, status=400)

    return page


class _Console:
    def __init__(self, cfg: Config, db: Database, gate: Gate) -> None:
        self.cfg, self.db, self.gate = cfg, db, gate
        self.scrubber = Scrubber(secrets_in(cfg))  # a driver's message may quote the DSN
        self.audits = Audits()

    async def read(self, fn: Callable[..., T], *args: Any) -> T:
        try:
            return await self.db.run(fn, *args)
        except (SafetynetError, psycopg.Error) as exc:
            first = str(exc).splitlines()[0] if str(exc) else ""
            raise Unavailable(self.scrubber.scrub(
                f"PostgreSQL: {type(exc).__name__}: {printable(first)}")) from exc

    def render(self, request: Request, template: str, data: dict[str, Any], *,
               status: int = 200, refresh: bool = False) -> HTMLResponse:
        user = getattr(request.state, "user", "")
        session = getattr(request.state, "session", "")
        body = _templates.get_template(template).render(
            **data, user=user, token=self.gate.token(session, user),
            allow_actions=self.cfg.console.allow_actions, jobs=JOBS, path=request.url.path,
            refresh=self.cfg.console.refresh if refresh else 0)
        return HTMLResponse(body, status)

    async def css(self, request: Request) -> Response:
        return Response(_CSS, media_type="text/css")

    # ------------------------------------------------------------------ pages

    @_page
    async def overview(self, request: Request) -> Response:
        daemon = await scrape(self.cfg.http.listen)
        data = await self.read(views.overview, self.cfg)
        charts = await chart_context(self.read, request.query_params, JOBS)
        return self.render(request, "overview.html", {**data, "daemon": daemon, **charts},
                           refresh=True)

    @_page
    async def job(self, request: Request) -> Response:
        """One job's charts (the overview links each job here)."""
        job = request.path_params["job"]
        if job not in JOBS:
            return self.render(request, "message.html", {
                "title": "not found", "message": "no such job"}, status=404)
        charts = await chart_context(self.read, request.query_params, (job,))
        return self.render(request, "job.html", {"job": job, **charts}, refresh=True)

    @_page
    async def recordings(self, request: Request) -> Response:
        q = request.query_params
        status = inputs.choice(q, "status", STATUSES, "Quarantined")
        window = inputs.choice(q, "window", views.WINDOWS, "all")
        search = q.get("q", "").strip()
        if len(search) > 512:
            raise BadInput("q", "at most 512 characters")
        try:
            after = views.Cursor.decode(q.get("after"))
        except ValueError:
            raise BadInput("after", "not a cursor of this page: follow its links") from None
        data = await self.read(views.recordings, status, window, after, search)
        return self.render(request, "recordings.html", {
            **data, "status": status, "window": window, "q": search,
            "live": q.get("live") == "1"}, refresh=q.get("live") == "1")

    @_page
    async def conferences(self, request: Request) -> Response:
        data = await self.read(views.conferences, self.cfg)
        return self.render(request, "conferences.html", data)

    @_page
    async def outbox(self, request: Request) -> Response:
        after = inputs.optional_whole(request.query_params, "after") or 0
        before = inputs.optional_whole(request.query_params, "before")
        relay = self.cfg.outbox_relay
        data = await self.read(views.outbox, after, before, source_of(relay)
                               if relay.source == "logical" else None)
        data["delivery"] = (await scrape(self.cfg.http.listen)).delivery
        # a refresh would lose the dead letters checked for a replay
        selecting = self.cfg.console.allow_actions and bool(data["dead"])
        return self.render(request, "outbox.html", data,
                           refresh=after == 0 and before is None and not selecting)

    @_page
    async def frozen_keys(self, request: Request) -> Response:
        """Every key held back, its blocker and the action that releases it."""
        found = await self.read(frozen_keys, views.PAGE)
        return self.render(request, "frozen_keys.html", {"found": found})

    @_page
    async def outbox_row(self, request: Request) -> Response:
        row_id = int(request.path_params["row_id"])
        row = await self.read(views.outbox_row, row_id) if row_id <= inputs.BIGINT_MAX \
            else None
        if row is None:
            return self.render(request, "message.html", {
                "title": "not found", "message": "no such outbox row (published rows are "
                "pruned after outbox_relay.retention)"}, status=404)
        return self.render(request, "outbox_row.html", {"row": row})

    @_page
    async def audit(self, request: Request) -> Response:
        """The last audit judged by this console and how long ago (running it is a POST)."""
        return self.render(request, "audit.html", {"last": self.audits.last,
                                                    "interval": AUDIT_MIN_INTERVAL_S})

    @_page
    async def run_audit(self, request: Request) -> Response:
        """Judge the invariants now (token-bound, rate-limited), then show them (303)."""
        parsed = await self._form(request, needs_actions=False)
        if isinstance(parsed, Response):
            return parsed
        busy = await self._judge(request)
        return busy or RedirectResponse("/audit", 303)

    async def _judge(self, request: Request) -> Response | None:
        wait = self.audits.wait()
        if wait:
            busy = self.render(request, "message.html", {
                "title": "audit: not now", "message": "an audit is running or ran less than "
                f"{AUDIT_MIN_INTERVAL_S:.0f} s ago: its result is on the audit page"},
                status=429)
            busy.headers["retry-after"] = str(max(1, round(wait + 0.5)))
            return busy
        started, violations = self.audits.start(), None
        try:
            violations = await self.read(views.audit, self.cfg)
        finally:
            self.audits.done(request.state.user, violations, started)
        return None

    @_page
    async def history(self, request: Request) -> Response:
        before = inputs.optional_whole(request.query_params, "before")
        since_text = request.query_params.get("since", "").strip()
        try:
            since = inputs.since(since_text)
        except BadInput as exc:
            return self.render(request, "history.html", {
                "rows": [], "next": None, "since": since_text, "error": str(exc)}, status=400)
        data = await self.read(views.trail, before, since)
        return self.render(request, "history.html", {**data, "since": since_text,
                                                      "error": ""}, refresh=before is None)

    # ---------------------------------------------------------------- actions

    async def _form(self, request: Request, *, needs_actions: bool = True
                    ) -> tuple[dict[str, Any], list[str]] | Response:
        """The form of an action, or the refusal: read-only, not a small urlencoded form,
        a bad token."""
        if needs_actions and not self.cfg.console.allow_actions:
            return self.render(request, "message.html", {
                "title": "read-only", "message": "this console is read-only "
                "(console.allow_actions = false): use the safetynet CLI, or enable actions"},
                status=403)
        form = await read_form(request)
        if isinstance(form, Response):
            return form
        if not self.gate.token_ok(request.state.session, request.state.user,
                                  str(form.get("token", ""))):
            return PlainTextResponse("missing or wrong form token: reload the page", 403)
        ids = [str(i) for i in form.getlist("ids")]
        if len(ids) > MAX_IDS:
            return PlainTextResponse(f"at most {MAX_IDS} ids at once", 400)
        return {k: str(v) for k, v in form.items() if k != "ids"}, ids

    def _who(self, request: Request) -> Actor:
        return Actor(request.state.user, Origin.CONSOLE,
                     request.client.host if request.client else None)

    async def _confirm_or_act(self, request: Request, verb: Verb,
                              act: Callable[[dict[str, Any], list[str], str], Awaitable[Any]],
                              *, needs_ids: bool = False,
                              check: Callable[[dict[str, Any], list[str]], Any] | None = None
                              ) -> Response:
        parsed = await self._form(request)
        if isinstance(parsed, Response):
            return parsed
        fields, ids = parsed
        if needs_ids and not ids:
            return self.render(request, "message.html", {
                "title": f"{verb.value}: nothing checked",
                "message": "check the rows to act on, then try again"}, status=400)
        reason = fields.get("reason", "").strip()[:1024]
        confirmed = fields.get("confirm") == "yes"
        try:
            if check is not None:
                check(fields, ids)
        except BadInput as exc:
            return self.render(request, "confirm.html", {
                "verb": verb.value, "ids": ids, "fields": fields, "error": str(exc)},
                status=400)
        if not confirmed or not reason:
            return self.render(request, "confirm.html", {
                "verb": verb.value, "ids": ids, "fields": fields,
                "error": "a reason is required" if confirmed else ""},
                status=400 if confirmed else 200)
        try:
            result = await act(fields, ids, reason)
        except Unavailable as exc:
            return self.render(request, "unavailable.html", {"why": str(exc)}, status=503)
        if isinstance(result, Response):
            return result
        return self.render(request, "done.html", {"verb": verb.value, "result": result})

    async def _write(self, fn: Callable[..., T], *args: Any) -> T:
        try:
            return await self.db.run(fn, *args)
        except (SafetynetError, psycopg.Error) as exc:
            raise Unavailable(f"PostgreSQL: {type(exc).__name__}") from exc

    async def act_requeue(self, request: Request) -> Response:
        def check(fields: dict[str, Any], ids: list[str]) -> None:
            inputs.choice(fields, "status", STATUSES, "Quarantined")
            inputs.uuids(ids)

        async def act(fields: dict[str, Any], ids: list[str], reason: str) -> Any:
            status = inputs.choice(fields, "status", STATUSES, "Quarantined")
            return await self._write(functools.partial(
                actions.requeue_snapshot, status=status), self._who(request), ids, reason)

        return await self._confirm_or_act(request, Verb.REQUEUE, act, check=check)

    async def act_release(self, request: Request) -> Response:
        async def act(fields: dict[str, Any], ids: list[str], reason: str) -> Any:
            return await self._write(actions.release_snapshot, self._who(request), ids,
                                     reason)

        return await self._confirm_or_act(request, Verb.RELEASE, act,
                                          check=lambda _, ids: inputs.uuids(ids))

    async def act_replay(self, request: Request) -> Response:
        async def act(fields: dict[str, Any], ids: list[str], reason: str) -> Any:
            return await self._write(actions.replay_snapshot, self._who(request), ids,
                                     reason)

        return await self._confirm_or_act(request, Verb.REPLAY, act, needs_ids=True,
                                          check=lambda _, ids: inputs.outbox_ids(ids))

    async def act_release_key(self, request: Request) -> Response:
        """Set aside the rows in retry holding back their keys (the frozen-keys page)."""
        async def act(fields: dict[str, Any], ids: list[str], reason: str) -> Any:
            return await self._write(actions.set_aside_snapshot, self._who(request), ids,
                                     reason)

        return await self._confirm_or_act(request, Verb.RELEASE_KEY, act, needs_ids=True,
                                          check=lambda _, ids: inputs.outbox_ids(ids))

    async def act_pause(self, request: Request) -> Response:
        def check(fields: dict[str, Any], ids: list[str]) -> None:
            _job(fields)
            inputs.pause_for(fields.get("for", "").strip())

        async def act(fields: dict[str, Any], ids: list[str], reason: str) -> Any:
            job, seconds = _job(fields), inputs.pause_for(fields.get("for", "").strip())
            done, trail_id = await self._write(actions.pause, self._who(request), job,
                                               reason, seconds)
            return {"job": job, "new": done.new, "paused_by": done.pause.paused_by,
                    "for_seconds": seconds, "trail_id": trail_id}

        return await self._confirm_or_act(request, Verb.PAUSE, act, check=check)

    async def act_resume(self, request: Request) -> Response:
        async def act(fields: dict[str, Any], ids: list[str], reason: str) -> Any:
            job = _job(fields)
            ended, trail_id = await self._write(actions.resume, self._who(request), job,
                                                reason)
            return {"job": job, "was_paused": ended is not None, "trail_id": trail_id}

        return await self._confirm_or_act(request, Verb.RESUME, act,
                                          check=lambda fields, _: _job(fields))

    async def act_audit(self, request: Request) -> Response:
        async def act(fields: dict[str, Any], ids: list[str], reason: str) -> Any:
            busy = await self._judge(request)
            if busy is not None:
                return busy
            assert self.audits.last is not None
            violations = self.audits.last.violations
            who = self._who(request)

            def trail(conn: psycopg.Connection) -> int:
                return record_action(conn, who, Verb.AUDIT, [], reason, {
                    "violations": len(violations),
                    "ids": [v.subject for v in violations][:100]})

            trail_id = await self._write(trail)
            return {"violations": [str(v) for v in violations], "trail_id": trail_id}

        return await self._confirm_or_act(request, Verb.AUDIT, act)


def _job(fields: dict[str, Any]) -> str:
    job = str(fields.get("job", ""))
    if job not in JOBS:
        raise BadInput("job", f"must be one of {', '.join(JOBS)}")
    return job

