"""Bad input at the operator console (issue #38 item 4): what a hostile or careless
request, a config or a daemon's answer does to ``safetynet console``. Each plant returns a
``run`` (the TOOL runner calls it in a thread): the console served in-process over ASGI
on the world's database (or ``safetynet console``/``history`` as a process), and what it
answered as one line — the status and the message an operator reads."""

from __future__ import annotations

import html
import http.server
import os
import re
import subprocess
import sys
import tempfile
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import attrs
import httpx
import tomli_w
import trio
from psycopg.types.json import Jsonb

from supervision.app.console.app import build_app
from supervision.app.console.daemon_metrics import MAX_BYTES
from supervision.db.database import open_database
from supervision.db.pgconn import conninfo
from supervision.passwords import MIN_N, hash_password
from tests.badinput.report import ROOT
from tests.badinput.world import Planted, World
from tests.integration.app.console.support import basic, console_config

SECRET = "badinput-proxy-secret-0042"
Ask = Callable[[httpx.AsyncClient], Awaitable[str]]


def said(response: httpx.Response) -> str:
    """The status and what the page says: its error, its message, or its plain text."""
    if response.headers.get("content-type", "").startswith("text/plain"):
        return f"{response.status_code} {response.text.strip()}"
    found = re.search(r'id="(?:error|message|payload-size|daemon-down|never-audited)">'
                      r"(.*?)</p>", response.text, re.S)
    return f"{response.status_code} {html.unescape(found.group(1)) if found else ''}"


def _console(world: World, ask: Ask, *, proxy: bool = False, daemon: str = "",
             **console: Any) -> Planted:
    """A console on the world's database (basic auth, or proxy_header trusting 127.0.0.1
    with SECRET; its daemon's metrics at *daemon*) answering *ask*."""
    if proxy:
        console = {"auth": "proxy_header", "trusted_proxies": ["127.0.0.1"],
                   "proxy_secret": SECRET, **console}

    async def serve() -> str:
        cfg = console_config(world.dsn, allow_actions=True, **console)
        if daemon:
            cfg = attrs.evolve(cfg, http=attrs.evolve(cfg.http, listen=daemon))
        async with open_database(conninfo(cfg.postgres, "badinput-console"), size=1) as db:
            transport = httpx.ASGITransport(app=build_app(cfg, db), client=("127.0.0.1", 9))
            async with httpx.AsyncClient(
                    transport=transport, base_url=f"http://{cfg.console.listen}",
                    headers={} if proxy else basic()) as client:
                return await ask(client)

    return Planted(extra={"run": lambda: trio.run(serve)})


async def _token(client: httpx.AsyncClient, page: str = "/") -> str:
    found = re.search(r'name="token" value="([0-9a-f]+)"', (await client.get(page)).text)
    assert found, "no form token"
    return found.group(1)


async def _post(client: httpx.AsyncClient, path: str, **kwargs: Any) -> httpx.Response:
    origin = {"Origin": str(client.base_url).rstrip("/"), "Sec-Fetch-Site": "same-origin"}
    return await client.post(path, headers={**origin, **kwargs.pop("headers", {})}, **kwargs)


def _nothing_acted(world: World) -> None:
    for table in ("job_pauses", "operator_actions", "outbox_dead_letters"):
        (count,) = world.conn.execute(
            f"SELECT count(*) FROM safetynet.{table}").fetchone() or (0,)  # noqa: S608
        assert count == 0, f"{table}: {count} rows"


# ------------------------------------------------------------------ requests


async def proxy_without_secret(world: World) -> Planted:
    async def ask(client: httpx.AsyncClient) -> str:
        return said(await client.get("/", headers={"X-Forwarded-User": "root"}))
    return _console(world, ask, proxy=True)


async def proxy_user_repeated(world: World) -> Planted:
    async def ask(client: httpx.AsyncClient) -> str:
        return said(await client.get("/", headers=[
            ("X-Forwarded-User", "ana"), ("X-Forwarded-User", "root"),
            ("X-Safetynet-Proxy-Secret", SECRET)]))
    return _console(world, ask, proxy=True)


async def host_rebinding(world: World) -> Planted:
    async def ask(client: httpx.AsyncClient) -> str:
        return said(await client.get("/", headers={"Host": "rebind.evil.test:9470"}))
    return _console(world, ask)


async def pause_for_prose(world: World) -> Planted:
    async def ask(client: httpx.AsyncClient) -> str:
        response = await _post(client, "/actions/pause", data={
            "token": await _token(client), "job": "recording-finalize", "confirm": "yes",
            "reason": "db upgrade", "for": "2 hours"})
        _nothing_acted(world)
        return said(response)
    return _console(world, ask)


async def replay_superscript_id(world: World) -> Planted:
    async def ask(client: httpx.AsyncClient) -> str:
        response = await _post(client, "/actions/replay", data={
            "token": await _token(client), "ids": "²", "confirm": "yes", "reason": "x"})
        _nothing_acted(world)
        return said(response)
    return _console(world, ask)


async def history_since_huge(world: World) -> Planted:
    async def ask(client: httpx.AsyncClient) -> str:
        return said(await client.get("/history", params={"since": "1000000d"}))
    return _console(world, ask)


async def form_multipart(world: World) -> Planted:
    async def ask(client: httpx.AsyncClient) -> str:
        response = await _post(client, "/actions/pause", data={
            "token": await _token(client), "job": "recording-finalize", "confirm": "yes",
            "reason": "x"}, files={"f": ("f.bin", b"\0" * 4096)})
        _nothing_acted(world)
        return said(response)
    return _console(world, ask)


async def form_one_mib(world: World) -> Planted:
    async def ask(client: httpx.AsyncClient) -> str:
        body = (f"token={await _token(client)}&job=recording-finalize&confirm=yes"
                "&reason=" + "x" * 1024 * 1024).encode()

        async def chunked() -> AsyncIterator[bytes]:  # no Content-Length to refuse early
            for start in range(0, len(body), 65536):
                yield body[start:start + 65536]

        response = await _post(client, "/actions/pause", content=chunked(), headers={
            "Content-Type": "application/x-www-form-urlencoded"})
        _nothing_acted(world)
        return said(response)
    return _console(world, ask)


async def payload_40mb(world: World) -> Planted:
    (row_id,) = world.conn.execute(
        "INSERT INTO messenger.integration_outbox (topic, message_key, dedupe_key,"
        " event_type, payload, published_at) VALUES ('t', 'k', 'badinput-40mb', 'e', %s,"
        " now()) RETURNING id", (Jsonb({"blob": "y" * 40_000_000}),)).fetchone() or (0,)

    async def ask(client: httpx.AsyncClient) -> str:
        response = await client.get(f"/outbox/{row_id}")
        assert len(response.content) < 200_000, len(response.content)
        return said(response)
    return _console(world, ask)


async def audit_by_get(world: World) -> Planted:
    async def ask(client: httpx.AsyncClient) -> str:
        for _ in range(20):  # a cross-site <img src=/audit?run=1>, again and again
            got = await client.get("/audit", params={"run": "1"})
        token = await _token(client, "/audit")
        first = await _post(client, "/audit/run", data={"token": token})
        second = await _post(client, "/audit/run", data={"token": token})
        return f"{said(got)}; POST {first.status_code}, at once again {second.status_code}"
    return _console(world, ask)


class _Endless(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()
        line = b"# " + b"x" * 65_533 + b"\n"
        try:
            for _ in range(64 * MAX_BYTES // len(line)):
                self.wfile.write(line)
        except OSError:
            pass

    def log_message(self, *args: Any) -> None:
        pass


async def metrics_endless(world: World) -> Planted:
    """The daemon at http.listen answers /metrics with an endless body."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Endless)
    threading.Thread(target=server.serve_forever, daemon=True).start()

    async def ask(client: httpx.AsyncClient) -> str:
        return re.sub(r"http://127\.0\.0\.1:\d+", "http://<daemon>",
                      said(await client.get("/")))

    run = _console(world, ask, daemon=f"127.0.0.1:{server.server_address[1]}").extra["run"]

    def stop_after() -> str:
        try:
            return str(run())
        finally:
            server.shutdown()
            server.server_close()
    return Planted(extra={"run": stop_after})


# ------------------------------------------------------------------ processes


def _safetynet(world: World, args: Sequence[str], console: dict[str, Any]) -> str:
    """``safetynet ARGS -c F`` with F the world's database and *console*; its exit code
    and its last stderr line."""
    with tempfile.TemporaryDirectory(prefix="badinput-console-") as directory:
        config = Path(directory) / "c.toml"
        config.write_text(tomli_w.dumps({"postgres": {"dsn": world.dsn}, "console": console}))
        done = subprocess.run(
            [sys.executable, "-m", "supervision.app", *args, "-c", str(config)],
            capture_output=True, text=True, check=False, cwd=ROOT, timeout=60,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(ROOT),
                 "COLUMNS": "200"})
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    return f"exit {done.returncode}: {lines[-1] if lines else ''}"


def console_process(console: dict[str, Any]) -> Callable[[World], Awaitable[Planted]]:
    async def plant(world: World) -> Planted:
        return Planted(extra={"run": lambda: _safetynet(world, ["console"], console)})
    return plant


async def history_cli_since_huge(world: World) -> Planted:
    return Planted(extra={"run": lambda: _safetynet(
        world, ["history", "--since", "1000000d"], {})})


async def replay_cli_superscript(world: World) -> Planted:
    return Planted(extra={"run": lambda: _safetynet(
        world, ["replay", "²", "--reason", "typo"], {})})


GOOD_HASH = hash_password("badinput", n=MIN_N)
CHEAP_HASH = hash_password("badinput", n=2**10)


# ------------------------------------------------- incident-scoped actions (item 3)


async def _incident_preview(client: httpx.AsyncClient, **fields: str) -> httpx.Response:
    return await _post(client, "/incident/preview", data={
        "token": await _token(client, "/incident"), "verb": "requeue", "incident": "INC-1",
        **fields})


async def incident_since_prose(world: World) -> Planted:
    async def ask(client: httpx.AsyncClient) -> str:
        response = await _incident_preview(client, status="Quarantined", since="2 hours")
        _nothing_acted(world)
        return said(response)
    return _console(world, ask)


async def incident_status_unknown(world: World) -> Planted:
    async def ask(client: httpx.AsyncClient) -> str:
        response = await _incident_preview(client, status="Done")
        _nothing_acted(world)
        return said(response)
    return _console(world, ask)


async def incident_field_of_another_verb(world: World) -> Planted:
    async def ask(client: httpx.AsyncClient) -> str:
        response = await _incident_preview(client, status="Quarantined", topic="orders")
        _nothing_acted(world)
        return said(response)
    return _console(world, ask)


async def incident_snapshot_forged(world: World) -> Planted:
    async def ask(client: httpx.AsyncClient) -> str:
        response = await _post(client, "/incident/act", data={
            "token": await _token(client), "snapshot": "A" * 24, "page": "1",
            "confirm": "yes", "reason": "x"})
        _nothing_acted(world)
        return said(response)
    return _console(world, ask)


async def incident_page_superscript(world: World) -> Planted:
    async def ask(client: httpx.AsyncClient) -> str:
        response = await _post(client, "/incident/act", data={
            "token": await _token(client), "snapshot": "A" * 24, "page": "²",
            "confirm": "yes", "reason": "x"})
        _nothing_acted(world)
        return said(response)
    return _console(world, ask)


async def incident_cli_since_huge(world: World) -> Planted:
    return Planted(extra={"run": lambda: _safetynet(
        world, ["requeue", "--incident", "INC-1", "--since", "1000000d", "--preview"], {})})
