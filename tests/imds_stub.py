"""A loopback stand-in for the EC2 instance metadata service (IMDSv2), for botocore's chain
(``AWS_EC2_METADATA_SERVICE_ENDPOINT`` points it here).

>>> with serve_imds(creds) as imds:
...     imds.up = False        # an outage: every request answers 503
...     imds.requests          # how many requests reached it
...     imds.seen              # (method, path, IMDSv2 session token sent) of each request
...     imds.access_key = ...  # the role's keys rotate: later reads get the new ones

Serves what botocore's ``InstanceMetadataFetcher`` asks for: ``PUT /latest/api/token``,
the role name under ``/latest/meta-data/iam/security-credentials/`` and the role's
temporary keys as JSON, expiring an hour later. The standard library's threading HTTP
server: botocore talks to it through a real socket.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import attrs

ROLE = "safetynet-node"
CREDS_PATH = "/latest/meta-data/iam/security-credentials/"
SESSION_TOKEN = "imds-session-token"
TOKEN_HEADER = "x-aws-ec2-metadata-token"


@attrs.define
class Imds:
    access_key: str
    secret_key: str
    token: str
    port: int = 0
    up: bool = True
    requests: int = 0
    seen: list[tuple[str, str, str | None]] = attrs.Factory(list)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}/"


def _handler(imds: Imds) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            return None

        def _answer(self, status: int, body: bytes = b"") -> None:
            self.send_response(status)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_PUT(self) -> None:
            imds.requests += 1
            imds.seen.append(("PUT", self.path, self.headers.get(TOKEN_HEADER)))
            if not imds.up:
                return self._answer(503)
            if self.path == "/latest/api/token":
                return self._answer(200, SESSION_TOKEN.encode())
            return self._answer(404)

        def do_GET(self) -> None:
            imds.requests += 1
            imds.seen.append(("GET", self.path, self.headers.get(TOKEN_HEADER)))
            if not imds.up:
                return self._answer(503)
            if self.path == CREDS_PATH:
                return self._answer(200, ROLE.encode())
            if self.path == CREDS_PATH + ROLE:
                expires = datetime.now(UTC) + timedelta(hours=1)
                return self._answer(200, json.dumps({
                    "Code": "Success", "Type": "AWS-HMAC", "AccessKeyId": imds.access_key,
                    "SecretAccessKey": imds.secret_key, "Token": imds.token,
                    "Expiration": expires.strftime("%Y-%m-%dT%H:%M:%SZ"),
                    "LastUpdated": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                }).encode())
            return self._answer(404)

    return Handler


@contextmanager
def serve_imds(access_key: str, secret_key: str, token: str) -> Iterator[Imds]:
    imds = Imds(access_key, secret_key, token)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(imds))
    imds.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield imds
    finally:
        server.shutdown()
        server.server_close()
