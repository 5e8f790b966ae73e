"""The console's guard, a middleware before every route: the Host allow-list,
authentication, the cross-site check of POSTs, the session cookie, the security headers
(:mod:`supervision.app.console.security` holds the rules; this applies them in order)."""

from __future__ import annotations

from typing import Any

from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from supervision.app.console.security import (
    HEADERS,
    SESSION_COOKIE,
    Gate,
    Login,
    Site,
    cross_site,
    new_session,
)


class Guard(BaseHTTPMiddleware):
    """The Host allow-list, authentication, the cross-site check of POSTs, the session
    cookie, the headers."""

    def __init__(self, app: Any, gate: Gate, site: Site) -> None:
        super().__init__(app)
        self.gate, self.site = gate, site

    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint
                       ) -> Response:
        response = await self._dispatch(request, call_next)
        for key, value in HEADERS.items():
            response.headers[key] = value
        return response

    async def _dispatch(self, request: Request, call_next: RequestResponseEndpoint
                        ) -> Response:
        client = request.client.host if request.client else ""
        pairs = [(k.lower(), v) for k, v in request.headers.items()]
        host = request.headers.getlist("host")
        if len(host) != 1 or not self.site.host_ok(host[0]):
            return PlainTextResponse("unknown Host: this console answers to its "
                                     "console.listen address or console.public_origin", 400)
        login = await self.gate.authenticate(client, pairs)
        session = request.cookies.get(SESSION_COOKIE, "")
        headers = dict(pairs)
        if not isinstance(login, Login):
            response: Response = PlainTextResponse(login.message, login.status, login.headers)
        elif request.method not in ("GET", "HEAD") and (why := cross_site(
                headers, self.site.origins(request.url.scheme, host[0]))):
            response = PlainTextResponse(f"cross-site request refused ({why})", 403)
        elif request.method not in ("GET", "HEAD") and not session:
            response = PlainTextResponse("no session: reload the page and try again", 403)
        else:
            request.state.user = login.user
            request.state.session = session or new_session()
            response = await call_next(request)
            if not session:  # the session the form token is bound to
                response.set_cookie(SESSION_COOKIE, request.state.session, httponly=True,
                                    samesite="strict", secure=request.url.scheme == "https"
                                    or self.site.public_origin.startswith("https:"),
                                    path="/")
        return response
