"""A local HTTP proxy that adds ``Authorization: Bearer …`` to every request it forwards.

The MCP conformance suite cannot send headers of its own, and every ``/mcp/<slug>`` needs the
endpoint's token; the suite talks to this proxy instead. Bodies are relayed whole (Switchboard
answers JSON, never a stream).
"""

from __future__ import annotations

import http.client
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

# Hop-by-hop headers are the proxy's own business (RFC 9110 §7.6.1).
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade"}


def _handler(target: str, token: str) -> type[BaseHTTPRequestHandler]:
    upstream = urlsplit(target)

    class Forward(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _forward(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            # Host passes through as a reverse proxy's would: the server checks Origin against it.
            headers = {
                k: v
                for k, v in self.headers.items()
                if k.lower() not in HOP_BY_HOP | {"authorization"}
            }
            headers["Authorization"] = f"Bearer {token}"
            connection = http.client.HTTPConnection(upstream.netloc, timeout=60)
            try:
                connection.request(self.command, self.path, body=body, headers=headers)
                answer = connection.getresponse()
                payload = answer.read()
            finally:
                connection.close()
            self.send_response(answer.status)
            for name, value in answer.getheaders():
                if name.lower() not in HOP_BY_HOP | {"content-length"}:
                    self.send_header(name, value)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        do_GET = do_POST = do_DELETE = do_PUT = do_OPTIONS = _forward

        def log_message(self, format: str, *args: object) -> None:
            pass  # the server under test logs what matters

    return Forward


@contextmanager
def auth_proxy(target: str, token: str) -> Iterator[str]:
    """Serve a proxy to ``target`` (a base URL) on a free local port; yields the proxy's base."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(target, token))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
