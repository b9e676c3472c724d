"""Fixtures for the pause tests: a LISTEN connection, a local HTTP server standing in for an
agent's notify hook, and eager Celery."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from switchboard.celery import app as celery_app
from tests.pause.helpers import Listener


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings: Any) -> None:
    """The personas' passwords are hashed with the production hasher otherwise: seconds per
    test on a busy machine, and nothing here is about passwords."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def listener(transactional_db: None) -> Iterator[Listener]:
    lst = Listener()
    yield lst
    lst.close()


@dataclass
class HookServer:
    url: str
    posts: list[dict[str, Any]] = field(default_factory=list)
    status: int = 204  # what the receiver answers (a test sets 500 for a receiver that is down)

    def bodies(self) -> list[dict[str, Any]]:
        return [json.loads(p["body"]) for p in self.posts]


@pytest.fixture
def hook_server(settings: Any) -> Iterator[HookServer]:
    """A local HTTP server recording every POST (the agent's side of the ready hook). Loopback
    is refused to hooks unless allowed (queues/hookguard.py): this receiver's address is put on
    the allow-list for the test."""
    settings.HOOK_ALLOWED_NETWORKS = ["127.0.0.1/32"]
    posts: list[dict[str, Any]] = []
    lock = threading.Lock()
    receiver = HookServer(url="", posts=posts)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            body = self.rfile.read(length).decode()
            with lock:
                posts.append(
                    {
                        "path": self.path,
                        "headers": dict(self.headers),
                        "body": body,
                        "at": time.monotonic(),
                    }
                )
            self.send_response(receiver.status)
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    host, port = server.server_address[:2]
    try:
        receiver.url = f"http://{host!s}:{port}/hook"
        yield receiver
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def eager_celery() -> Iterator[None]:
    """Run Celery tasks in-process when enqueued (the real task function and its retry
    policy, without a broker round trip)."""
    saved = (celery_app.conf.task_always_eager, celery_app.conf.task_eager_propagates)
    celery_app.conf.task_always_eager = True
    celery_app.conf.task_eager_propagates = True
    yield
    celery_app.conf.task_always_eager, celery_app.conf.task_eager_propagates = saved
