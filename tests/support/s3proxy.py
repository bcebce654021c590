"""An S3-API endpoint on loopback that does not honour conditional writes.

:func:`unconditional_s3` runs an HTTP server on 127.0.0.1 (a thread of the test
process) that forwards every request to a real S3-API server (the moto server of
``support.s3``) with the ``If-None-Match`` header removed: to a client it behaves
like an S3-compatible store that ignores ``PUT If-None-Match: *`` and overwrites,
as some S3-compatible servers do. Everything else (objects, listings, errors) is the
real server's answer. The server is shut down when the context exits.
"""

from __future__ import annotations

import contextlib
import http.client
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

DROPPED = {"if-none-match", "host", "connection", "keep-alive", "proxy-connection"}
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length"}


def _handler(upstream: str) -> type[BaseHTTPRequestHandler]:
    target = urlsplit(upstream)

    class Forward(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _forward(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            headers = {k: v for k, v in self.headers.items() if k.lower() not in DROPPED}
            headers["Host"] = target.netloc
            conn = http.client.HTTPConnection(target.hostname, target.port, timeout=60)
            try:
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
            finally:
                conn.close()
            self.send_response(resp.status, resp.reason)
            for k, v in resp.getheaders():
                if k.lower() not in HOP_BY_HOP:
                    self.send_header(k, v)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - quiet
            pass

    return Forward


@contextlib.contextmanager
def unconditional_s3(upstream: str) -> Iterator[str]:
    """The endpoint URL of a loopback S3 endpoint that forwards to ``upstream`` minus conditional writes."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(upstream))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="s3-no-conditional", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
