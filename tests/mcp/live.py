"""A live Switchboard web process (uvicorn) on a free port, against the test database.

Tests that drive real HTTP clients (the MCP SDK, schemathesis) need a server in another process:
the data they set up must be committed (``transactional_db`` / ``tx_personas``) to be seen.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from django.conf import settings

BASE_DIR = Path(__file__).resolve().parent.parent.parent
READY_TIMEOUT = 60.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return int(response.status) < 500
    except urllib.error.HTTPError as error:
        return error.code < 500
    except OSError:
        return False


@contextmanager
def live_server(database_url: str, *, workers: int = 1) -> Iterator[str]:
    """Run uvicorn serving switchboard.asgi:application; yields its base URL."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = {
        **os.environ,
        "DATABASE_URL": database_url,
        "REDIS_URL": settings.REDIS_URL,
        "DJANGO_SETTINGS_MODULE": "switchboard.settings",
        "SWITCHBOARD_PUBLIC_URL": base,
        "LOG_LEVEL": "ERROR",
    }
    command = [
        sys.executable, "-m", "uvicorn", "switchboard.asgi:application",
        "--host", "127.0.0.1", "--port", str(port),
        "--lifespan", "off", "--no-access-log", "--log-level", "warning",
        "--workers", str(workers),
    ]  # fmt: skip
    # The server's log (every 4xx is a django.request warning) goes to a file, shown on failure.
    with tempfile.NamedTemporaryFile(prefix="switchboard-live-", suffix=".log") as log:
        process = subprocess.Popen(command, cwd=BASE_DIR, env=env, stdout=log, stderr=log)
        try:
            deadline = time.monotonic() + READY_TIMEOUT
            while not _answers(f"{base}/api/v1/openapi.json"):
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"uvicorn did not come up (exit {process.poll()}):\n"
                        + Path(log.name).read_text(errors="replace")[-4000:]
                    )
                time.sleep(0.1)
            yield base
        finally:
            process.terminate()
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=15)
