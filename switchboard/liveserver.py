"""A Switchboard web process (uvicorn) on a free port, for the bench and the tests that drive
real HTTP clients (the MCP SDK, schemathesis, the HTTP bench).

The server runs in another process, so the data it serves must be committed first.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

from django.conf import settings
from django.db import connection

from switchboard import webserver
from switchboard.embedded import free_port

BASE_DIR = Path(__file__).resolve().parent.parent
READY_TIMEOUT = 60.0

__all__ = [
    "current_database_url",
    "free_port",
    "live_server",
    "server_command",
    "wait_until_up",
]


def current_database_url() -> str:
    """A URL to the database this process is connected to (the test database in tests), for
    child processes."""
    s = connection.settings_dict
    host, port, user = str(s["HOST"]), s["PORT"], s["USER"]
    auth = user + (f":{s['PASSWORD']}" if s.get("PASSWORD") else "")
    if host.startswith("/"):
        return f"postgresql://{auth}@/{s['NAME']}?host={host}&port={port}"
    return f"postgresql://{auth}@{host}:{port}/{s['NAME']}"


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return int(response.status) < 500
    except urllib.error.HTTPError as error:
        return error.code < 500
    except OSError:
        return False


def wait_until_up(process: subprocess.Popen[bytes], url: str, log: Path) -> None:
    """Wait until ``url`` answers below 500; raises with the server's log if it exits or stalls."""
    deadline = time.monotonic() + READY_TIMEOUT
    while not _answers(url):
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(
                f"the server did not come up (exit {process.poll()}):\n"
                + log.read_text(errors="replace")[-4000:]
            )
        time.sleep(0.1)


def server_command(
    host: str, port: int, *, workers: int = 1, server: Literal["uvicorn", "gunicorn"] = "uvicorn"
) -> list[str]:
    """The web server's command line: ``uvicorn`` (``make run``) or the README's production
    command, gunicorn with uvicorn workers. Both use httptools and uvloop (pinned)."""
    if server == "gunicorn":
        return [
            sys.executable, "-m", "gunicorn", "switchboard.asgi:application",
            "-k", webserver.WORKER, "-w", str(workers),
            "-b", f"{host}:{port}", "--log-level", "warning",
        ]  # fmt: skip
    return [
        sys.executable, "-m", "uvicorn", "switchboard.asgi:application",
        "--host", host, "--port", str(port), "--workers", str(workers),
        "--lifespan", "off", "--no-access-log", "--log-level", "warning",
        "--http", webserver.PROTOCOL, "--loop", "uvloop",
    ]  # fmt: skip


@contextmanager
def live_server(
    database_url: str | None = None,
    *,
    workers: int = 1,
    env: dict[str, str] | None = None,
    server: Literal["uvicorn", "gunicorn"] = "uvicorn",
) -> Iterator[str]:
    """Run a web server serving switchboard.asgi:application; yields its base URL. ``env`` adds
    to (or overrides) the server's environment, e.g. another REDIS_URL for the fault tests."""
    extra = env or {}
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = {
        **os.environ,
        "DATABASE_URL": database_url or current_database_url(),
        "REDIS_URL": settings.REDIS_URL,
        "DJANGO_SETTINGS_MODULE": "switchboard.settings",
        "SWITCHBOARD_PUBLIC_URL": base,
        "LOG_LEVEL": "ERROR",
    }
    env.update(extra)
    command = server_command("127.0.0.1", port, workers=workers, server=server)
    if server == "uvicorn":
        # As `manage.py serve` does: on SIGTERM, streams still open are cut after this long
        # instead of holding the process (and the test waiting) until SIGKILL.
        command += ["--timeout-graceful-shutdown", "2"]
    # The server's log (every 4xx is a django.request warning) goes to a file, shown on failure.
    with tempfile.NamedTemporaryFile(prefix="switchboard-live-", suffix=".log") as log:
        process = subprocess.Popen(command, cwd=BASE_DIR, env=env, stdout=log, stderr=log)
        try:
            wait_until_up(process, f"{base}/api/v1/openapi.json", Path(log.name))
            yield base
        finally:
            process.terminate()
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=15)
