"""A web server's graceful stop, as a service manager (SIGTERM) or ``make run`` gives it: the
production command (gunicorn with ``switchboard.webserver.Worker``) and ``make run``'s uvicorn.

- The last counter increments reach Redis before the process ends: uvicorn ends a process it
  stopped on SIGTERM by raising the signal again with its default action, so no atexit hook runs;
  the ASGI lifespan's shutdown sends them.
- Open agent event streams (which never end by themselves) hold a stop for a bounded time only,
  then end; no worker is SIGKILLed and nothing is logged about a bad file descriptor.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from django.conf import settings

from queues import metrics
from queues.management.commands.serve import web_command
from switchboard.core import counters
from switchboard.liveserver import BASE_DIR, free_port, server_command, wait_until_up
from tests.conftest import Personas, database_url

APP = "switchboard.asgi:application"
UNFLUSHED_APP = "tests.web.unflushed_app:application"  # no flush but the stop's
STOP_WAIT_SECONDS = 30.0  # generous: the bound is 5 s, gunicorn's own 60 s below


class Server:
    def __init__(self, process: subprocess.Popen[bytes], base: str, log: Path) -> None:
        self.process, self.base, self.log = process, base, log

    def stop(self) -> int:
        """SIGTERM; the exit status (it must exit within STOP_WAIT_SECONDS)."""
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=STOP_WAIT_SECONDS)

    @property
    def output(self) -> str:
        return self.log.read_text(errors="replace")


def _command(kind: str, port: int, app: str) -> list[str]:
    if kind == "make run":
        return web_command("127.0.0.1", port, app)
    command = server_command("127.0.0.1", port, workers=2, server="gunicorn")
    command[command.index(APP)] = app
    # gunicorn's own bound far beyond the worker's: a stop within the wait is the worker's doing.
    return [*command, "--graceful-timeout", "60", "--log-level", "info"]


@contextmanager
def _server(kind: str, app: str = APP) -> Iterator[Server]:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "REDIS_URL": settings.REDIS_URL,
        "DJANGO_SETTINGS_MODULE": "switchboard.settings",
        "SWITCHBOARD_PUBLIC_URL": base,
    }
    with tempfile.TemporaryDirectory(prefix="sb-shutdown-") as folder:
        log = Path(folder) / "server.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                _command(kind, port, app), cwd=BASE_DIR, env=env, stdout=out, stderr=out
            )
        server = Server(process, base, log)
        try:
            wait_until_up(process, f"{base}/api/v1/openapi.json", log)
            yield server
        finally:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=15)


def _created_total() -> int:
    return sum(counters.read(metrics.CREATED).values())


@pytest.mark.parametrize("kind", ["gunicorn", "make run"])
def test_increments_made_just_before_a_sigterm_are_in_redis_after_the_server_exits(
    tx_personas: Personas, kind: str
) -> None:
    auth = {"Authorization": f"Bearer {tx_personas.agent_token}"}
    with _server(kind, UNFLUSHED_APP) as server:
        for i in range(5):
            created = httpx.post(
                f"{server.base}/api/v1/agent/create_todo",
                headers=auth,
                json={"queue": "inbox", "title": f"last {i}"},
                timeout=30,
            )
            assert created.status_code == 200, created.text
        assert _created_total() == 0  # still buffered in the server
        # uvicorn ends by raising the SIGTERM again (-15); gunicorn's master exits 0.
        assert server.stop() in (0, -signal.SIGTERM), server.output
    assert _created_total() == 5, server.output


def _open_stream(base: str, token: str) -> socket.socket:
    host, port = base.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=STOP_WAIT_SECONDS)
    sock.sendall(
        f"GET /api/v1/agent/events HTTP/1.1\r\nHost: {host}\r\n"
        f"Authorization: Bearer {token}\r\nAccept: text/event-stream\r\n\r\n".encode()
    )
    assert sock.recv(65536).startswith(b"HTTP/1.1 200"), "the stream did not open"
    return sock


def _read_to_end(sock: socket.socket, ended: list[bytes]) -> None:
    """Read the stream until the server closes it; ``ended`` gets its last bytes."""
    tail = b""
    try:
        while chunk := sock.recv(65536):
            tail = (tail + chunk)[-64:]
    except OSError:
        pass
    ended.append(tail)


@pytest.mark.parametrize("kind", ["gunicorn", "make run"])
def test_the_server_stops_within_its_bound_with_event_streams_open(
    tx_personas: Personas, kind: str
) -> None:
    with _server(kind) as server:
        streams = [_open_stream(server.base, tx_personas.agent_token) for _ in range(4)]
        ended: list[bytes] = []
        readers = [threading.Thread(target=_read_to_end, args=(s, ended)) for s in streams]
        for reader in readers:
            reader.start()
        try:
            # uvicorn ends a process it stopped on SIGTERM by raising the signal again.
            assert server.stop() in (0, -signal.SIGTERM), server.output
            for reader in readers:
                reader.join(timeout=STOP_WAIT_SECONDS)
            assert len(ended) == 4
            # Each ended as a chunked response ends (it was cut after a chunk, and the log had
            # "Exception in ASGI application" for each: round 5).
            assert all(tail.endswith(b"0\r\n\r\n") for tail in ended), ended
        finally:
            for sock in streams:
                sock.close()
        output = server.output
    assert "SIGKILL" not in output, output
    assert "Bad file descriptor" not in output, output
    assert "Exception in ASGI application" not in output, output
    # The streams' cancellation is the design, not a fault: no ERROR and no traceback on a
    # deploy (uvicorn's "timeout graceful shutdown exceeded", asyncio's RequestAborted).
    assert "ERROR" not in output and "Traceback" not in output, output
    assert "timeout graceful shutdown exceeded (open event streams" in output, output


def test_a_stop_logs_no_bad_file_descriptor(tx_personas: Personas) -> None:
    with _server("gunicorn") as server:
        assert server.stop() == 0
        assert "Error while closing socket" not in server.output, server.output
        assert "Shutting down: Master" in server.output
