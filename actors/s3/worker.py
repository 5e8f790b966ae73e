"""The S3 worker process: SigV4-signed HEADs made by libcurl, off the daemon's interpreter.

    python -m actors.s3.worker      # started by actors.s3.process, never by hand

Why (issue #4): through httpx, signing and HTTP cost about a millisecond of Python CPU
per HEAD, on the GIL the claimer and the committers need; the backlog drain was bound by
that, not by the store. Here libcurl (pycurl's multi interface) does the HTTP and the
SigV4 signing (``CURLOPT_AWS_SIGV4``) in C, in a process of its own: about 0.2 ms of CPU
per HEAD, none of it in the daemon, which pays for one short JSON line each way
(``actors.s3.wire``).

Protocol: the settings line, then requests and credential updates, on stdin; answers
on stdout in completion order, as many per write as are ready — while requests still
queue here, an answer waits up to :data:`ANSWER_HOLD` for others, so the daemon wakes
once per batch of answers and sends its refills as one write (an error answer goes at
once, with those held before it: the daemon's breaker must not learn of an outage late).
New credentials (the daemon refreshed temporary ones) sign every request started after
they arrive; requests already on the wire finish with the keys they were signed with. A
session token goes out as the ``x-amz-security-token`` header, which libcurl's SigV4
signs with the others.
TLS is verified against ``s3.ca_file`` (else certifi's bundle); a certificate it does not
trust, or a CA file libcurl cannot read, is a :class:`Fault` (configuration), not a
transport error to retry. Every request gets exactly one answer: HTTP
statuses are classified by ``actors.s3.objectstore``, transport failures (timeout,
refused, reset) become :class:`Transient` with a curl error name, never an exception.
At most ``s3.concurrency`` requests are on the wire (one easy handle each, connections
kept alive in the multi handle's cache); the daemon may queue more, which wait here.
Nothing is logged (stdout is the protocol; libcurl's messages can hold the URL); a bug
prints its traceback to the inherited stderr and exits, which the daemon treats as a
lost worker.

One thread, one ``select`` over stdin and curl's sockets. End of stdin (the daemon closed
the pipe, or died) exits at once: the daemon has already given up on what is in flight.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import os
import resource
import select
import sys
import time
from typing import TYPE_CHECKING
from urllib.parse import quote, urlsplit, urlunsplit

import attrs
import certifi
import pycurl

from actors.s3.objectstore import (
    CANARY,
    LIST_MAX_KEYS,
    MAX_LIST_BODY,
    Fault,
    HeadOutcome,
    Poison,
    Transient,
    classify_bucket,
    classify_canary,
    classify_listing,
    classify_object,
    printable,
)
from actors.s3.wire import (
    OP_BUCKET,
    OP_CANARY,
    OP_LIST,
    OP_OBJECT,
    Bucket,
    Credentials,
    LineSplitter,
    Settings,
    decode_input,
    decode_settings,
    encode_answer,
)

if TYPE_CHECKING:  # the worker never imports the configuration (nor psycopg)
    from supervision.config import S3Config

READ_SIZE = 64 * 1024
PR_SET_DUMPABLE = 4  # <linux/prctl.h>
IDLE_WAIT = 1.0  # seconds; select() wakes sooner for stdin or a socket
# Answers wait up to this long for others while requests are still queued here (the
# connections have work, so the daemon's refills are not urgent): one pipe write — and
# one wake-up of the daemon, which then sends its refills in one write — per batch, not
# per answer. With nothing queued, or when one of them is an error (the daemon's breaker
# must see a failing store at once, before more queued HEADs go out), they go at once.
ANSWER_HOLD = 0.002
# libcurl error codes → the class names stored in last_error (no URL, no host)
TRANSPORT_ERRORS = {
    pycurl.E_COULDNT_RESOLVE_HOST: "ResolveError",
    pycurl.E_COULDNT_CONNECT: "ConnectError",
    pycurl.E_OPERATION_TIMEDOUT: "Timeout",
    pycurl.E_SSL_CONNECT_ERROR: "TlsError",
    pycurl.E_GOT_NOTHING: "EmptyReply",
    pycurl.E_SEND_ERROR: "WriteError",
    pycurl.E_RECV_ERROR: "ReadError",
}
# libcurl errors that retrying cannot fix: the endpoint's certificate is not trusted by
# s3.ca_file (or certifi), or the CA file cannot be read — configuration faults
FAULT_ERRORS = {
    pycurl.E_PEER_FAILED_VERIFICATION: "tls_certificate_untrusted",
    pycurl.E_SSL_CACERT_BADFILE: "tls_ca_file_unreadable",
}
SECURITY_TOKEN_HEADER = "x-amz-security-token"
# libcurl errors that mean the server answered something that is not a readable HTTP
# response (a header line past libcurl's own 100 KB limit, a malformed status line or
# header): the answer, not the network, is wrong, so retrying the row will not help.
RESPONSE_ERRORS = {
    8: "malformed_response",  # CURLE_WEIRD_SERVER_REPLY (pycurl: E_FTP_WEIRD_SERVER_REPLY)
    100: "headers_too_large",  # CURLE_TOO_LARGE (libcurl 8.6+)
}
MAX_HEADER_BYTES = 64 * 1024  # all header lines of one response (S3 metadata: 2 KB)
MAX_HEADER_VALUE = 256  # characters of one header value kept


@attrs.define(eq=False)
class _Request:
    request_id: int
    op: str
    key: str
    header_lines: list[bytes] = attrs.Factory(list)
    header_bytes: int = 0
    oversized: bool = False  # the response's headers went past MAX_HEADER_BYTES
    body: bytearray = attrs.Factory(bytearray)  # a listing's body (HEADs have none)
    body_oversized: bool = False  # a listing's body went past MAX_LIST_BODY

    def on_header(self, line: bytes) -> int | None:
        """libcurl's header callback: keep the line, or abort the transfer (-1) once the
        response's headers exceed :data:`MAX_HEADER_BYTES`."""
        self.header_bytes += len(line)
        if self.header_bytes > MAX_HEADER_BYTES:
            self.oversized = True
            return -1
        self.header_lines.append(line)
        return None

    def on_body(self, data: bytes) -> int | None:
        """libcurl's write callback (listings only): keep up to :data:`MAX_LIST_BODY`
        bytes, abort past it (a listing of 20 keys is a few kilobytes)."""
        if len(self.body) + len(data) > MAX_LIST_BODY:
            self.body_oversized = True
            return 0  # fewer bytes than given: libcurl aborts the transfer
        self.body += data
        return None

    def headers(self) -> dict[str, str]:
        """The final response's headers: lower-case names, values cut to
        :data:`MAX_HEADER_VALUE` printable ASCII characters (they may reach ``last_error``
        through an error code; PostgreSQL refuses a NUL)."""
        found: dict[str, str] = {}
        for raw in self.header_lines:
            line = raw.decode("latin-1")
            if line.startswith("HTTP/"):  # a new response (after a 1xx): start over
                found.clear()
                continue
            name, sep, value = line.partition(":")
            if sep:
                found[name.strip().lower()] = printable(value.strip()[:MAX_HEADER_VALUE])
        return found

    def outcome(self, status: int) -> HeadOutcome:
        headers = self.headers()
        if self.op == OP_BUCKET:
            return classify_bucket(status, headers)
        if self.op == OP_CANARY:
            return classify_canary(status, headers)
        if self.op == OP_LIST:
            return classify_listing(self.key, status, headers, bytes(self.body))
        return classify_object(self.key, status, headers)

    def unreadable(self, reason: str) -> HeadOutcome:
        """An answer this worker cannot classify: Poison for an object (that row alone is
        quarantined with the reason), Transient for the bucket and canary probes."""
        if self.op == OP_OBJECT:
            return Poison(f"response_unreadable:{reason}")
        return Transient(f"response_unreadable:{reason}")


def object_url(cfg: Bucket | S3Config, key: str) -> str:
    """The URL of *key* (``""``: the bucket) in ``cfg.bucket``: path style puts the bucket
    in the path, virtual-hosted style in front of the endpoint's host name."""
    parts = urlsplit(cfg.endpoint_url)
    base_path = parts.path.rstrip("/")
    if cfg.addressing_style == "virtual":
        host = f"{cfg.bucket}.{parts.netloc}"
        path = base_path + "/" + quote(key)
    else:
        host = parts.netloc
        path = f"{base_path}/{quote(cfg.bucket)}" + (f"/{quote(key)}" if key else "")
    return urlunsplit((parts.scheme, host, path, "", ""))


def list_url(cfg: Bucket | S3Config) -> str:
    """ListObjectsV2 of the keys directly under ``cfg.key_prefix`` (at most
    :data:`LIST_MAX_KEYS`), parameters in the canonical (sorted) order SigV4 signs."""
    query = (f"delimiter=%2F&list-type=2&max-keys={LIST_MAX_KEYS}"
             f"&prefix={quote(cfg.key_prefix, safe='-_.~')}")
    return f"{object_url(cfg, '')}?{query}"


def sign_with(handle: pycurl.Curl, credentials: Credentials | None, region: str) -> None:
    """Make *handle* sign its requests with *credentials* (SigV4, the session token as a
    signed header), or send them unsigned (None)."""
    if credentials is None:
        for option in (pycurl.USERNAME, pycurl.PASSWORD, pycurl.HTTPHEADER):
            handle.unsetopt(option)
        handle.setopt(pycurl.HTTPAUTH, pycurl.HTTPAUTH_BASIC)  # no user: no Authorization
        return
    token = credentials.session_token.reveal()
    handle.setopt(pycurl.AWS_SIGV4, f"aws:amz:{region}:s3")
    handle.setopt(pycurl.USERNAME, credentials.access_key_id.reveal())
    handle.setopt(pycurl.PASSWORD, credentials.secret_access_key.reveal())
    handle.setopt(pycurl.HTTPHEADER, [f"{SECURITY_TOKEN_HEADER}: {token}"] if token else [])


class CurlPool:
    """Queued HEAD requests, ``s3.concurrency`` of them on the wire at a time."""

    def __init__(self, settings: Settings) -> None:
        cfg = self._cfg = settings.s3
        self._multi = pycurl.CurlMulti()
        self._multi.setopt(pycurl.M_MAX_TOTAL_CONNECTIONS, cfg.concurrency)
        self._idle = [self._new_handle() for _ in range(cfg.concurrency)]
        self._queued: collections.deque[_Request] = collections.deque()
        self._running: dict[pycurl.Curl, _Request] = {}
        self._credentials: Credentials | None = None
        self._generation = 0
        self._handle_generation: dict[pycurl.Curl, int] = {}
        self.errors = 0  # answers so far that were not Found / Missing
        self.set_credentials(settings.credentials)

    def _new_handle(self) -> pycurl.Curl:
        cfg = self._cfg
        handle = pycurl.Curl()
        handle.setopt(pycurl.NOBODY, 1)  # HEAD
        handle.setopt(pycurl.NOSIGNAL, 1)
        handle.setopt(pycurl.FOLLOWLOCATION, 0)
        handle.setopt(pycurl.TIMEOUT_MS, int(cfg.timeout * 1000))
        handle.setopt(pycurl.CONNECTTIMEOUT_MS, int(cfg.timeout * 1000))
        handle.setopt(pycurl.CAINFO, cfg.ca_file or certifi.where())
        return handle

    def set_credentials(self, credentials: Credentials | None) -> None:
        """Sign the requests started from now on with *credentials*. Without credentials
        requests go unsigned; a store that requires them answers 403, which is a
        configuration fault (readiness 503), not a crash."""
        self._credentials = credentials
        self._generation += 1

    def submit(self, request_id: int, op: str, recording_id: str) -> None:
        if op == OP_BUCKET:
            key = ""
        elif op == OP_CANARY:
            key = f"{self._cfg.key_prefix}{CANARY}"
        elif op == OP_LIST:
            key = self._cfg.key_prefix  # what classify_listing reads keys against
        else:
            key = f"{self._cfg.key_prefix}{recording_id}"
        self._queued.append(_Request(request_id, op, key))

    def _start_queued(self) -> None:
        while self._queued and self._idle:
            request, handle = self._queued.popleft(), self._idle.pop()
            if self._handle_generation.get(handle) != self._generation:
                sign_with(handle, self._credentials, self._cfg.region)
                self._handle_generation[handle] = self._generation
            if request.op == OP_LIST:  # a GET with a body, then a HEAD handle again
                handle.setopt(pycurl.NOBODY, 0)
                handle.setopt(pycurl.HTTPGET, 1)
                handle.setopt(pycurl.WRITEFUNCTION, request.on_body)
                handle.setopt(pycurl.URL, list_url(self._cfg))
            else:
                handle.setopt(pycurl.URL, object_url(self._cfg, request.key))
            handle.setopt(pycurl.HEADERFUNCTION, request.on_header)
            self._running[handle] = request
            self._multi.add_handle(handle)

    def step(self) -> list[bytes]:
        """Start what can start, let curl work, and return the answers that are ready."""
        self._start_queued()
        while self._multi.perform()[0] == pycurl.E_CALL_MULTI_PERFORM:
            pass
        answers: list[bytes] = []
        while True:
            left, succeeded, failed = self._multi.info_read()
            for handle in succeeded:
                answers.append(self._finish(handle, None))
            for handle, errno, _message in failed:  # the message can name the host
                answers.append(self._finish(handle, errno))
            if not left:
                break
        if answers:
            self._start_queued()
        return answers

    def _finish(self, handle: pycurl.Curl, errno: int | None) -> bytes:
        self._multi.remove_handle(handle)
        request = self._running.pop(handle)
        if request.op == OP_LIST:
            handle.setopt(pycurl.NOBODY, 1)  # back to HEAD
            handle.unsetopt(pycurl.WRITEFUNCTION)
        self._idle.append(handle)
        outcome: HeadOutcome
        if request.oversized:
            outcome = request.unreadable("headers_too_large")
        elif request.body_oversized:
            outcome = request.unreadable("body_too_large")
        elif errno in FAULT_ERRORS:
            outcome = Fault(FAULT_ERRORS[errno])
        elif errno in RESPONSE_ERRORS:
            outcome = request.unreadable(RESPONSE_ERRORS[errno])
        elif errno is not None:
            outcome = Transient(TRANSPORT_ERRORS.get(errno, f"curl_{errno}"))
        else:
            try:
                outcome = request.outcome(int(handle.getinfo(pycurl.RESPONSE_CODE)))
            except Exception as exc:  # input must never kill the worker: that row only
                outcome = request.unreadable(type(exc).__name__)
        if isinstance(outcome, Transient | Fault | Poison):
            self.errors += 1
        return encode_answer(request.request_id, outcome)

    @property
    def queued(self) -> int:
        """Requests waiting for a connection."""
        return len(self._queued)

    def wait(self, stdin: int | None, limit: float = IDLE_WAIT) -> bool:
        """Sleep until a socket or *stdin* is ready, curl wants a timer, or *limit*
        seconds pass; True when *stdin* is readable."""
        readable, writable, failed = self._multi.fdset()
        timeout_ms = self._multi.timeout()
        timeout = min(limit, IDLE_WAIT if timeout_ms < 0 else timeout_ms / 1000)
        watch = [*readable, *([stdin] if stdin is not None else [])]
        ready, _, _ = select.select(watch, writable, failed, timeout)
        return stdin is not None and stdin in ready


def serve_worker(stdin: int, stdout: int) -> None:
    """Answer requests from file descriptor *stdin* on *stdout* until *stdin* ends."""
    splitter = LineSplitter()
    lines: list[bytes] = []
    while not lines:
        data = os.read(stdin, READ_SIZE)
        if not data:
            return
        lines = splitter.feed(data)
    pool = CurlPool(decode_settings(lines[0]))
    pending = lines[1:]
    held: list[bytes] = []
    held_since = 0.0
    while True:
        for line in pending:
            message = decode_input(line)
            if isinstance(message, Credentials):
                pool.set_credentials(message)
            else:
                pool.submit(*message)
        errors = pool.errors
        answers = pool.step()
        now = time.monotonic()
        if answers and not held:
            held_since = now
        held += answers
        queued = pool.queued if pool.errors == errors else 0  # an error goes at once
        hold = answer_hold(held_since, now, queued) if held else IDLE_WAIT
        if held and hold <= 0:
            _write_all(stdout, b"".join(held))
            held, hold = [], IDLE_WAIT
        pending = []
        if pool.wait(stdin, hold):
            data = os.read(stdin, READ_SIZE)
            if not data:
                return
            pending = splitter.feed(data)


def answer_hold(held_since: float, now: float, queued: int) -> float:
    """How much longer answers held since *held_since* may wait for others (<= 0: write
    them now): up to :data:`ANSWER_HOLD` while *queued* requests keep the connections
    busy, not at all when none are queued."""
    return held_since + ANSWER_HOLD - now if queued else 0.0


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def no_core_dumps() -> None:
    """This process holds the S3 credentials: no core file (RLIMIT_CORE 0) and, on Linux,
    not dumpable (``PR_SET_DUMPABLE`` 0: no core, no ptrace or /proc/PID/mem by the
    same user). Done before the settings line, which carries the keys, is read."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if sys.platform == "linux":
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)


def main() -> None:
    no_core_dumps()
    serve_worker(sys.stdin.fileno(), sys.stdout.fileno())


if __name__ == "__main__":
    main()
