"""A real web server in the test process: uvicorn (httptools, uvloop, as ``make run``) serving
``switchboard.asgi.application`` on a free port, in a thread. Being in-process, a test can read
what the server holds: its open request tasks, the doorbell's attached streams and watchers (on
the server's loop), and the database connections its threads took from the pool (one pool per
process).

What a test writes must be committed (``transactional_db``) for the server to see it.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import uvicorn
from django.db import connection

from switchboard import embedded, webserver
from switchboard.asgi import ARRIVED

T = TypeVar("T")


class _Server(uvicorn.Server):
    loop: asyncio.AbstractEventLoop | None = None

    async def startup(self, sockets: Any = None) -> None:
        self.loop = asyncio.get_running_loop()
        await super().startup(sockets)


class Served:
    def __init__(self, server: _Server, base: str) -> None:
        self.server = server
        self.base = base

    def on_loop(self, fn: Callable[[], T]) -> T:
        """``fn()`` run on the server's event loop (where its streams live), its result."""
        assert self.server.loop is not None

        async def call() -> T:
            return fn()

        return asyncio.run_coroutine_threadsafe(call(), self.server.loop).result(timeout=10)

    def requests(self) -> int:
        """Requests the server is serving now (uvicorn's task per request)."""
        return self.on_loop(lambda: len(self.server.server_state.tasks))

    def doorbell(self) -> tuple[int, int]:
        """The doorbell's attached streams and fleet-wide watchers on the server's loop."""
        from queues import doorbell

        def count() -> tuple[int, int]:
            bell = doorbell._DOORBELLS.get(asyncio.get_running_loop())
            return (0, 0) if bell is None else (bell.streams(), len(bell._watchers))

        return self.on_loop(count)


def idle_in_pool(raw: Any) -> bool:
    """Whether ``raw``, a connection of this process's pool, is back in the pool and idle.

    This reads one connection where the pool's statistics count them all: another thread of the
    test process (an earlier test's worker thread, which gives its kept connection back once
    idle) can take or give back one of its own at any moment, which moves the count (ci133:
    2 == 3 + 1)."""
    pool = connection.pool  # type: ignore[attr-defined]
    assert pool is not None, "the tests run with DATABASE_POOL on (the default)"
    with pool._lock:  # psycopg_pool's lock over its deque of idle connections
        return any(idle is raw for idle in pool._pool)


@contextmanager
def handed_out(thread_prefix: str) -> Iterator[list[Any]]:
    """The connections this process's pool hands out, inside the block, to threads whose name
    starts with ``thread_prefix`` (the in-process server's console threads are ``django_<n>``,
    its agents' ``agent_<n>``), in order.

    A test follows those connections (``idle_in_pool``) where the pool's statistics count every
    thread's: an agent thread of an earlier test gives its kept connection back once idle, at a
    moment of its own."""
    pool = connection.pool  # type: ignore[attr-defined]
    assert pool is not None, "the tests run with DATABASE_POOL on (the default)"
    taken: list[Any] = []
    real = pool.getconn

    def getconn(timeout: float | None = None) -> Any:
        conn = real(timeout)
        if threading.current_thread().name.startswith(thread_prefix):
            taken.append(conn)
        return conn

    pool.getconn = getconn  # the instance's, over the class's: what Django's connect() calls
    try:
        yield taken
    finally:
        del pool.getconn


def settle(condition: Callable[[], bool], timeout: float = 15.0) -> bool:
    """Poll ``condition`` until it holds (the server finishes on its own threads)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


@contextmanager
def uvicorn_thread(
    app: Any, *, server_class: type[uvicorn.Server] = uvicorn.Server, **options: Any
) -> Iterator[uvicorn.Server]:
    """uvicorn on 127.0.0.1:<a free port> (``server.config.port``) serving ``app`` in a thread,
    as every launch command runs it (``webserver.PROTOCOL``, uvloop) unless ``options`` say
    otherwise; stopped when the block ends."""
    settings: dict[str, Any] = {
        "host": "127.0.0.1",
        "port": embedded.free_port(),
        "log_level": "warning",
        "lifespan": "off",
        "http": webserver.PROTOCOL,
        "loop": "uvloop",
        "timeout_graceful_shutdown": 2,
    }
    server = server_class(uvicorn.Config(app, **{**settings, **options}))
    thread = threading.Thread(target=server.run, name="uvicorn-test", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    try:
        yield server
    finally:
        server.should_exit = True
        thread.join(timeout=15)


@contextmanager
def serving() -> Iterator[Served]:
    from switchboard.asgi import application

    with uvicorn_thread(application, server_class=_Server) as server:
        assert isinstance(server, _Server)
        yield Served(server, f"http://127.0.0.1:{server.config.port}")


def agent_scope(
    verb: str,
    token: str | None,
    body: bytes,
    *,
    path: str | None = None,
    query: bytes = b"",
    content_type: bytes = b"application/json",
    host: bytes = b"127.0.0.1:8000",
    extra: list[tuple[bytes, bytes]] | None = None,
    arrived: float | None = None,
) -> dict[str, Any]:
    """The ASGI scope uvicorn hands the app for an agent's POST (a verb's path unless ``path``)."""
    headers = [(b"host", host), (b"content-length", str(len(body)).encode())]
    if content_type:
        headers.append((b"content-type", content_type))
    if token is not None:
        headers.append((b"authorization", f"Bearer {token}".encode()))
    headers += extra or []
    path = path or f"/api/v1/agent/{verb}"
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": query,
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
        ARRIVED: time.monotonic() if arrived is None else arrived,
    }
