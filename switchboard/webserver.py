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
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

PROTOCOL = "switchboard.webserver:Protocol"  # uvicorn --http
WORKER = "switchboard.webserver.Worker"  # gunicorn -k
# How long a graceful stop waits for open responses (event streams never end by themselves)
# before cancelling them: uvicorn's --timeout-graceful-shutdown in ``make run``, the worker's
# own bound in production.
STREAM_GRACE_SECONDS = 5


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
        super()._start_asgi_task(cycle, app)


def __getattr__(name: str) -> Any:
    """``Worker``, made when gunicorn asks for it: ``uvicorn.workers`` imports gunicorn, which
    ``make run``'s uvicorn (importing ``Protocol`` from here) has no use for."""
    if name != "Worker":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from uvicorn.workers import UvicornWorker

    class Worker(UvicornWorker):
        """gunicorn's worker class for the production command: uvicorn with uvloop and
        ``Protocol`` (uvicorn's own worker class picks httptools itself), the ASGI lifespan
        (its shutdown sends the last counter increments: switchboard.asgi), and a bound on a
        graceful stop: open event streams are cancelled after ``STREAM_GRACE_SECONDS``, or half
        of gunicorn's --graceful-timeout if that is shorter (the other half is the lifespan's),
        instead of holding the worker until the master SIGKILLs it."""

        CONFIG_KWARGS = {"loop": "uvloop", "http": PROTOCOL, "lifespan": "on"}
        sockets: list[Any]  # gunicorn's listening sockets (gunicorn has no type hints)

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.config.timeout_graceful_shutdown = min(
                STREAM_GRACE_SECONDS, self.cfg.graceful_timeout / 2
            )

        def run(self) -> None:
            # uvicorn gets the plain sockets, not gunicorn's wrappers: uvloop closes a listening
            # socket's object after libuv has closed its descriptor, and the wrapper logged
            # that close's EBADF ("Error while closing socket") at every stop.
            self.sockets = [getattr(s, "sock", s) for s in self.sockets]
            super().run()

    globals()["Worker"] = Worker
    return Worker
