"""``switchboard.webserver.Protocol``: each response's head and body in one write, and nothing
else of uvicorn's HTTP changed.

A real uvicorn (uvloop, the protocol under test) serves a small ASGI app on a free port, in a
thread; the clients are raw sockets, so the bytes on the wire are what is asserted. The
transport's writes are counted by a subclass that wraps the real transport (it forwards every
call), so "one write per response" is asserted, not inferred from timing.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from switchboard import webserver
from tests.inprocess import uvicorn_thread

WRITES: list[bytes] = []
_release = threading.Event()


class _Counted:
    """The real transport, its writes recorded."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport

    def write(self, data: bytes) -> None:
        WRITES.append(bytes(data))
        self._transport.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class _CountingProtocol(webserver.Protocol):
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(_Counted(transport))  # type: ignore[arg-type]


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    assert scope["type"] == "http"
    body = b""
    more = True
    while more:
        message = await receive()
        body += message.get("body", b"")
        more = message.get("more_body", False)
    path = scope["path"]
    if path == "/stream":  # no Content-Length: chunked, head at once
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await asyncio.get_running_loop().run_in_executor(None, _release.wait, 10)
        await send({"type": "http.response.body", "body": b"event", "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        return
    if path == "/empty":
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})
        return
    if path == "/fail-after-start":
        await send(
            {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"9")]}
        )
        raise RuntimeError("the app failed after starting its response")
    content = b"echo:" + path.encode() + b":" + body
    headers = [(b"Content-Type", b"text/plain"), (b"Content-Length", str(len(content)).encode())]
    if path.endswith("/close"):
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    if path == "/parts":
        await send({"type": "http.response.body", "body": content[:4], "more_body": True})
        await send({"type": "http.response.body", "body": content[4:]})
        return
    await send({"type": "http.response.body", "body": content})


@contextmanager
def _serving() -> Iterator[int]:
    try:
        with uvicorn_thread(
            _app, log_level="critical", http=_CountingProtocol, timeout_keep_alive=5
        ) as server:
            yield server.config.port
    finally:
        _release.set()


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    with _serving() as port:
        yield port


@pytest.fixture(autouse=True)
def _fresh() -> None:
    WRITES.clear()
    _release.clear()


def _read_until(sock: socket.socket, expected: int, timeout: float = 5.0) -> bytes:
    """Read until ``expected`` responses (by their status lines) are whole, or the peer closes."""
    sock.settimeout(timeout)
    data = b""
    while True:
        if data.count(b"HTTP/1.1 ") >= expected and _complete(data, expected):
            return data
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk


def _complete(data: bytes, expected: int) -> bool:
    rest = data
    for _ in range(expected):
        head, sep, rest = rest.partition(b"\r\n\r\n")
        if not sep:
            return False
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        if b" 204 " in head.split(b"\r\n")[0]:
            length = 0
        if len(rest) < length:
            return False
        rest = rest[length:]
    return True


def _post(path: str, body: bytes = b"", extra: bytes = b"") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: t\r\nContent-Length: {len(body)}\r\n".encode()
        + extra
        + b"\r\n"
        + body
    )


def test_a_response_with_a_content_length_is_written_once(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(_post("/one", b"hi"))
        data = _read_until(sock, 1)
    assert data.startswith(b"HTTP/1.1 200 OK\r\n")
    assert data.endswith(b"\r\n\r\necho:/one:hi")
    assert b"content-length: 12\r\n" in data and b"content-type: text/plain\r\n" in data
    assert [data] == WRITES  # head and body together


def test_a_body_sent_in_parts_goes_out_with_the_head_then_the_rest(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(_post("/parts", b"xy"))
        data = _read_until(sock, 1)
    assert data.endswith(b"\r\n\r\necho:/parts:xy")
    assert len(WRITES) == 2
    assert WRITES[0].endswith(b"\r\n\r\necho") and WRITES[1] == b":/parts:xy"


def test_keep_alive_serves_the_next_request_on_the_same_connection(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port)) as sock:
        for n in range(3):
            sock.sendall(_post(f"/k{n}", b"b"))
            data = _read_until(sock, 1)
            assert data.endswith(f"echo:/k{n}:b".encode())
    assert len(WRITES) == 3


def test_pipelined_requests_are_answered_in_order(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(_post("/p1", b"a") + _post("/p2", b"bb") + _post("/p3", b"ccc"))
        data = _read_until(sock, 3)
    bodies = [part.split(b"\r\n\r\n", 1)[1][:12] for part in data.split(b"HTTP/1.1 ")[1:]]
    assert [b.split(b"HTTP")[0] for b in bodies] == [b"echo:/p1:a", b"echo:/p2:bb", b"echo:/p3:ccc"]


def test_head_is_answered_with_its_head_only(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"HEAD /h HTTP/1.1\r\nHost: t\r\n\r\n")
        sock.settimeout(5)
        data = b""
        while not data.endswith(b"\r\n\r\n"):
            data += sock.recv(65536)
        # The connection stays usable: the HEAD's head was not held back for a body.
        sock.sendall(_post("/after-head"))
        after = _read_until(sock, 1)
    assert data.startswith(b"HTTP/1.1 200 OK\r\n") and data.endswith(b"\r\n\r\n")
    assert b"content-length: 8\r\n" in data  # "echo:/h:", as a POST would have it
    assert after.endswith(b"echo:/after-head:")


def test_an_empty_body_and_connection_close(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(_post("/empty"))
        data = _read_until(sock, 1)
        assert data.startswith(b"HTTP/1.1 204 No Content\r\n")
        sock.sendall(_post("/close", b"z"))
        data = _read_until(sock, 1)
        assert data.endswith(b"echo:/close:z") and b"connection: close\r\n" in data
        assert sock.recv(10) == b""  # closed by the server after the response


def test_a_stream_without_content_length_shows_its_head_before_its_first_event(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"GET /stream HTTP/1.1\r\nHost: t\r\n\r\n")
        sock.settimeout(5)
        head = sock.recv(65536)  # while the app still waits for its first event
        assert head.startswith(b"HTTP/1.1 200 OK\r\n") and head.endswith(b"\r\n\r\n")
        assert b"transfer-encoding: chunked\r\n" in head
        _release.set()
        rest = b""
        while not rest.endswith(b"0\r\n\r\n"):
            rest += sock.recv(65536)
    assert rest == b"5\r\nevent\r\n0\r\n\r\n"


def test_expect_100_continue_is_answered_before_the_body_is_sent(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(_post("/c", b"body", b"Expect: 100-continue\r\n")[: -len(b"body")])
        sock.settimeout(5)
        assert sock.recv(65536) == b"HTTP/1.1 100 Continue\r\n\r\n"
        sock.sendall(b"body")
        data = _read_until(sock, 1)
    assert data.startswith(b"HTTP/1.1 200 OK\r\n") and data.endswith(b"echo:/c:body")


def test_a_failure_after_the_response_started_still_sends_its_head_then_closes(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(_post("/fail-after-start"))
        sock.settimeout(5)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    # As uvicorn alone: the head went out, then the connection was closed (the body never came).
    assert data.startswith(b"HTTP/1.1 200 OK\r\n") and data.endswith(b"content-length: 9\r\n\r\n")
