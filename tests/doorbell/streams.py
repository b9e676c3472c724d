"""A real server-sent-events client on a thread: it reads the agent event stream and queues each
event, so a test can count rings exactly. Silence is proved with a sentinel: a todo pushed after
the code under test whose ring, arriving last, closes the count (rings arrive in commit order)."""

from __future__ import annotations

import contextlib
import json
import queue
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx


class EventStream:
    def __init__(self, base: str, token: str, last_event_id: str | None = None) -> None:
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self.attached = threading.Event()
        self.last_id: str | None = None
        headers = {"Authorization": f"Bearer {token}", "Accept": "text/event-stream"}
        if last_event_id:
            headers["Last-Event-ID"] = last_event_id
        self._client = httpx.Client(timeout=httpx.Timeout(5.0, read=60.0))
        self._cm = self._client.stream("GET", f"{base}/api/v1/agent/events", headers=headers)
        self.response = self._cm.__enter__()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        fields: dict[str, str] = {}
        try:
            for line in self.response.iter_lines():
                if line == ": attached":
                    self.attached.set()
                elif line.startswith(("id:", "event:", "data:")):
                    name, _, value = line.partition(":")
                    fields[name] = value.strip()
                elif line == "" and "data" in fields:
                    self.events.put({"id": fields.get("id"), **json.loads(fields["data"])})
                    fields = {}
        except httpx.HTTPError:
            pass

    def next(self, timeout: float = 15.0) -> dict[str, Any]:
        event = self.events.get(timeout=timeout)
        self.last_id = event["id"]
        return event

    def until(self, todo_id: str, timeout: float = 15.0) -> list[dict[str, Any]]:
        """Every event up to (not including) the ring naming ``todo_id``."""
        seen: list[dict[str, Any]] = []
        while True:
            event = self.next(timeout)
            if event["todo"] == todo_id:
                return seen
            seen.append(event)

    def close(self) -> None:
        """Hang up as a departing agent does: the server must see the connection end. Closing
        the client alone leaves the socket open while the reader thread blocks in recv(), and
        the server's stream then outlives the test (its process waits for it on SIGTERM)."""
        sock = self.response.extensions["network_stream"].get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        self._thread.join(timeout=5)
        self._client.close()


def wait_for(condition: Callable[[], bool], timeout: float = 30.0) -> bool:
    """Poll ``condition`` until it holds (a functional wait on work another thread does)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


@contextmanager
def attached(base: str, token: str, last_event_id: str | None = None) -> Iterator[EventStream]:
    """An open agent event stream, once the server says it is attached (and LISTENing)."""
    stream = EventStream(base, token, last_event_id)
    try:
        assert stream.response.status_code == 200
        assert stream.response.headers["content-type"].startswith("text/event-stream")
        assert stream.attached.wait(15)
        yield stream
    finally:
        stream.close()
