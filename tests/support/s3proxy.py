"""Fault-injecting S3-API endpoints on loopback, in front of a real S3-API server.

Each context runs an HTTP server on 127.0.0.1 (threads of the test process) that
forwards requests to a real S3-API server (the moto server of ``support.s3``) and
changes only what its fault says; objects, listings and every other answer are the
real server's. The server is shut down when the context exits.

- :func:`unconditional_s3`: drops the ``If-None-Match`` header, like S3-compatible
  servers that ignore ``PUT If-None-Match: *`` and overwrite.
- :func:`conflicting_s3`: answers ``409 ConditionalRequestConflict`` to a conditional
  PUT while another conditional PUT to the same key is in flight, as AWS S3 does
  (moto never does: it checks and writes under no conflict detection). Each
  conditional PUT is held ``hold_s`` before it is forwarded, a slow server, so that
  racing clients overlap; ``always=True`` answers 409 to every conditional PUT.
- ``lost_reply=True`` (conflicting_s3): the first conditional PUT of each key is
  applied upstream but answered ``500 InternalError``, a reply lost after the write.
- ``Faults(latency_s=...)``: every request waits that long before it is forwarded, a
  distant endpoint (``bench/log_bench.py``); ``requests`` counts them.
- ``Faults(deny_reads="...")``: a GET of a key containing that text is answered ``403
  AccessDenied`` (a policy that hides part of the store), counted in ``denied``.
- ``Faults.down = True``: an outage; every request's connection is closed unanswered.
"""

from __future__ import annotations

import contextlib
import copy
import http.client
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

HOP = {"host", "connection", "keep-alive", "proxy-connection"}
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length"}
CONFLICT_XML = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>ConditionalRequestConflict</Code>'
                b"<Message>A conflicting conditional operation is currently in progress against this resource. "
                b"Please try again.</Message><RequestId>fault-proxy</RequestId></Error>")
DENIED_XML = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>AccessDenied</Code>'
              b"<Message>Access Denied</Message><RequestId>fault-proxy</RequestId></Error>")
INTERNAL_XML = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>InternalError</Code>'
                b"<Message>We encountered an internal error. Please try again.</Message>"
                b"<RequestId>fault-proxy</RequestId></Error>")


@dataclass
class Faults:
    """What the proxy does to conditional PUTs (and to every request: ``latency_s``), and what it
    did (counters read by the tests)."""

    strip_condition: bool = False
    detect_conflicts: bool = False
    hold_s: float = 0.0
    always: bool = False
    lost_reply: bool = False
    latency_s: float = 0.0
    deny_reads: str = ""
    down: bool = False
    requests: int = 0  # requests received
    denied: int = 0  # GETs answered 403
    conflicts: int = 0  # 409 answers given
    lost: int = 0  # writes applied but answered 500
    conditional_puts: int = 0
    _in_flight: set[str] = field(default_factory=set)
    _lost_keys: set[str] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def admit(self, key: str) -> bool:
        """Whether a conditional PUT of ``key`` proceeds (else: answer 409)."""
        with self._lock:
            self.conditional_puts += 1
            if self.always or (self.detect_conflicts and key in self._in_flight):
                self.conflicts += 1
                return False
            self._in_flight.add(key)
            return True

    def done(self, key: str) -> bool:
        """Release ``key``; True if this reply is to be lost (answered 500 although applied)."""
        with self._lock:
            self._in_flight.discard(key)
            if self.lost_reply and key not in self._lost_keys:
                self._lost_keys.add(key)
                self.lost += 1
                return True
            return False


def _handler(upstream: str, faults: Faults) -> type[BaseHTTPRequestHandler]:
    target = urlsplit(upstream)

    class Forward(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _answer(self, status: int, reason: str, headers: list[tuple[str, str]], data: bytes) -> None:
            self.send_response(status, reason)
            for k, v in headers:
                if k.lower() not in HOP_BY_HOP:
                    self.send_header(k, v)
            # a HEAD answer has no body: its Content-Length is the object's, as upstream said
            length = next((v for k, v in headers if k.lower() == "content-length"), None) \
                if self.command == "HEAD" else None
            self.send_header("Content-Length", length if length is not None else str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        def _upstream(self, body: bytes | None, drop: set[str]) -> tuple[int, str, list[tuple[str, str]], bytes]:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in drop}
            headers["Host"] = target.netloc
            conn = http.client.HTTPConnection(target.hostname, target.port, timeout=60)
            try:
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                return resp.status, resp.reason, resp.getheaders(), resp.read()
            finally:
                conn.close()

        def _forward(self) -> None:
            with faults._lock:
                faults.requests += 1
            if faults.down:
                self.close_connection = True  # an outage: no answer, the connection dropped
                return
            if faults.latency_s:
                time.sleep(faults.latency_s)  # a distant endpoint: each request's round trip
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            if faults.deny_reads and self.command == "GET" and faults.deny_reads in urlsplit(self.path).path:
                with faults._lock:
                    faults.denied += 1
                self._answer(403, "Forbidden", [("Content-Type", "application/xml")], DENIED_XML)
                return
            conditional = self.command == "PUT" and self.headers.get("If-None-Match") == "*"
            if not conditional or faults.strip_condition:
                drop = HOP | ({"if-none-match"} if faults.strip_condition else set())
                self._answer(*self._upstream(body, drop))
                return
            key = urlsplit(self.path).path
            if not faults.admit(key):
                self._answer(409, "Conflict", [("Content-Type", "application/xml")], CONFLICT_XML)
                return
            try:
                if faults.hold_s:
                    time.sleep(faults.hold_s)  # a slow server: keeps the write in flight (fault injection)
                status, reason, headers, data = self._upstream(body, HOP)
            finally:
                lost = faults.done(key)
            if lost and status == 200:
                self._answer(500, "Internal Server Error", [("Content-Type", "application/xml")], INTERNAL_XML)
            else:
                self._answer(status, reason, headers, data)

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

        def log_message(self, format: str, *args: object) -> None:  # quiet
            pass

    return Forward


def options_via(storage_options: dict[str, Any], endpoint: str) -> dict[str, Any]:
    """A copy of s3fs ``storage_options`` that reaches the same bucket through ``endpoint``."""
    options = copy.deepcopy(storage_options)
    options.setdefault("client_kwargs", {})["endpoint_url"] = endpoint
    return options


@contextlib.contextmanager
def faulty_s3(upstream: str, faults: Faults) -> Iterator[str]:
    """The endpoint URL of a loopback proxy to ``upstream`` that applies ``faults``."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(upstream, faults))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="s3-fault-proxy", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@contextlib.contextmanager
def unconditional_s3(upstream: str) -> Iterator[str]:
    """A loopback S3 endpoint that forwards to ``upstream`` minus conditional writes."""
    with faulty_s3(upstream, Faults(strip_condition=True)) as endpoint:
        yield endpoint


@contextlib.contextmanager
def conflicting_s3(upstream: str, *, hold_s: float = 0.0, always: bool = False,
                   lost_reply: bool = False) -> Iterator[tuple[str, Faults]]:
    """A loopback S3 endpoint answering 409 ConditionalRequestConflict as AWS S3 does (see the module doc)."""
    faults = Faults(detect_conflicts=True, hold_s=hold_s, always=always, lost_reply=lost_reply)
    with faulty_s3(upstream, faults) as endpoint:
        yield endpoint, faults
