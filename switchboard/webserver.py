"""uvicorn's HTTP protocol (httptools) with each response's head and body in one write.

uvicorn writes a response's status line and headers as soon as the app sends
``http.response.start``, and its body in a second write: two ``send`` system calls, two TCP
segments and two wake-ups of the client for every response, where one would do (issue 11). In a
GIL profile of the web process under the HTTP bench the head's write was the loop's largest
item (~14 % of GIL samples), but that is mostly the loop holding the GIL while descheduled after
waking the client: the system call itself costs the server ~1 µs. What one write buys is the
client's second wake-up: a minimal app at 8 Node clients, one write against two, measured the
client's CPU per cycle 0.31 → 0.25 ms (medians of 6 interleaved rounds).

``Protocol`` keeps the head of a response that declares its Content-Length and sends it with
the first body write, or before the connection is closed, whichever comes first. A response
without a Content-Length (an event stream, chunked) has its head written at once as before, so
a client sees a stream open before its first event. Nothing else changes: keep-alive,
pipelining, flow control, ``Connection: close``, HEAD and the timeouts are uvicorn's own.

Every launch command selects it: ``make run`` (``manage.py serve``) and the tests' servers with
``--http switchboard.webserver:Protocol``, the README's production command with gunicorn's
worker class ``switchboard.webserver.Worker``. This module imports no Django: gunicorn's master
imports it before any worker loads the app.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Sequence
from typing import Any

from uvicorn.protocols.http.httptools_impl import (
    HEADER_RE,
    HEADER_VALUE_RE,
    STATUS_LINE,
    HttpToolsProtocol,
    RequestResponseCycle,
)
from uvicorn.protocols.utils import get_client_addr, get_path_with_query_string

PROTOCOL = "switchboard.webserver:Protocol"
# The scope's extension naming the request's cycle (a weak reference: the cycle holds the scope).
CYCLE = "switchboard.cycle"
# An app's header as send_whole writes it, checked as uvicorn's send checks it, per (name,
# value): an agent's answers repeat the same few headers (their lengths vary a little), and
# checking each against two regular expressions on every response was most of the cost of
# sending it. Emptied when full. (uvicorn's own headers, the date changing every second, are
# not kept.)
_LINES: dict[tuple[bytes, bytes], bytes] = {}
_LINES_MAX = 1024
_FRAMING = (b"content-length:", b"connection:", b"transfer-encoding:")


class _OneWrite:
    """The connection's transport as a response's cycle sees it until its head is written: the
    head of a response with a Content-Length (and a body: not HEAD) is held and goes out with
    the next write, the body's, or before a close. Then the cycle writes to the transport
    itself again. One per connection, given to each request's cycle in turn (a connection's
    responses are written one after the other, pipelined ones included)."""

    __slots__ = ("_cycle", "_head", "_transport")

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._cycle: RequestResponseCycle = None  # type: ignore[assignment]  # set per request
        self._head: bytes | None = None

    def write(self, data: bytes) -> None:
        cycle = self._cycle
        head = self._head
        if head is not None:
            self._head = None
            cycle.transport = self._transport
            self._transport.write(head + data)
        elif not cycle.response_started:  # "100 Continue", written while the body is read
            self._transport.write(data)
        elif cycle.chunked_encoding is False and cycle.scope["method"] != "HEAD":
            # The head (uvicorn writes it whole when the response starts); the body's write
            # follows, even an empty one (Content-Length: 0).
            self._head = data
        else:  # no Content-Length (chunked: a stream) or HEAD (no body write): as uvicorn does
            cycle.transport = self._transport
            self._transport.write(data)

    def close(self) -> None:
        head = self._head
        if head is not None:
            self._head = None
            self._transport.write(head)
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class Protocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, each response written once (head and body together)."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._one_write = _OneWrite(transport)

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        # Each request's cycle is started here (at once, or after the pipelined ones before
        # it), before it can write anything.
        one_write = self._one_write
        one_write._cycle = cycle
        cycle.transport = one_write  # type: ignore[assignment]
        scope: dict[str, Any] = cycle.scope  # type: ignore[assignment]  # a TypedDict
        scope.setdefault("extensions", {})[CYCLE] = weakref.ref(cycle)
        super()._start_asgi_task(cycle, app)


def send_whole(
    scope: dict[str, Any], status: int, headers: Sequence[tuple[bytes, bytes]], body: bytes
) -> bool:
    """Send a whole response in one call, without awaiting: the bytes uvicorn's ``send`` writes
    for ``http.response.start`` then one ``http.response.body`` (its default headers, names in
    lower case, ``connection: close`` when the connection ends), in one write, and the response
    completed as ``send`` completes it (keep-alive, the next pipelined request, the access log).

    For an app's answer already in memory (the agents' lean path): two awaited ``send`` calls,
    each checking every header again, cost ~15 µs of the event loop per response (issue 11).
    Through this, its headers' lines kept (``_LINES``), the loop's whole part of a request
    (parsing, the task, the answer) measured ~6 µs less, one thread timed alone.
    Returns False, having done nothing, when the server is not ``Protocol`` or the response is
    not a plain one this mirrors (HEAD, a Content-Length not the body's, a Connection or
    Transfer-Encoding header, a header uvicorn would refuse, a client gone or not reading):
    the app then sends it with ``send`` as before."""
    extensions = scope.get("extensions")
    ref = extensions.get(CYCLE) if extensions else None
    cycle: RequestResponseCycle | None = ref() if ref is not None else None
    if (
        cycle is None
        or cycle.response_started
        or cycle.disconnected
        or cycle.flow.write_paused
        or scope["method"] == "HEAD"
    ):
        return False
    content = [STATUS_LINE[status]]
    for name, value in cycle.default_headers:  # date, server and any --header
        line = _line(name, value)
        if line is None or line.startswith(_FRAMING):
            return False
        content.append(line)
    length = None
    lines = _LINES
    for header in headers:
        line = lines.get(header)
        if line is None:
            line = _line(*header)
            if line is None:
                return False
            if len(lines) >= _LINES_MAX:
                lines.clear()
            lines[header] = line
        if line.startswith(_FRAMING):
            if not line.startswith(b"content-length:") or length is not None:
                return False
            length = header[1]
        content.append(line)
    if length is None or not length.isdigit() or int(length) != len(body):
        return False
    if not cycle.keep_alive:
        content.append(b"connection: close\r\n")
    content.append(b"\r\n")
    content.append(body)
    if cycle.access_log:
        cycle.access_logger.info(
            '%s - "%s %s HTTP/%s" %d',
            get_client_addr(cycle.scope),
            scope["method"],
            get_path_with_query_string(cycle.scope),
            scope["http_version"],
            status,
        )
    transport = cycle.transport
    if isinstance(transport, _OneWrite):
        transport = transport._transport
        cycle.transport = transport
    cycle.response_started = True
    cycle.waiting_for_100_continue = False
    cycle.chunked_encoding = False
    cycle.expected_content_length = 0
    cycle.response_complete = True
    transport.write(b"".join(content))
    cycle.message_event.set()
    if not cycle.keep_alive:
        transport.close()
    cycle.on_response()
    return True


def _line(name: bytes, value: bytes) -> bytes | None:
    """A header's line as uvicorn's send writes it (the name in lower case), or None when send
    would refuse it."""
    if HEADER_RE.search(name) or HEADER_VALUE_RE.search(value):
        return None
    return b"".join((name.lower(), b": ", value, b"\r\n"))


def __getattr__(name: str) -> Any:
    """``Worker``, made when gunicorn asks for it: ``uvicorn.workers`` imports gunicorn, which
    ``make run``'s uvicorn (importing ``Protocol`` from here) has no use for."""
    if name != "Worker":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from uvicorn.workers import UvicornWorker

    class Worker(UvicornWorker):
        """gunicorn's worker class for the production command: uvicorn with uvloop and
        ``Protocol`` (uvicorn's own worker class picks httptools itself)."""

        CONFIG_KWARGS = {"loop": "uvloop", "http": PROTOCOL}

    globals()["Worker"] = Worker
    return Worker
