"""`manage.py serve` end to end, on a fresh data folder of its own.

The launcher gets its own embedded PostgreSQL and Valkey (DATABASE_URL and REDIS_URL removed from
its environment), must answer on the admin and /metrics, must stop every child and both embedded
servers on SIGTERM with exit status 0, and must come up again on the same data folder without
seeding twice.
"""

from __future__ import annotations

import shutil
import socket
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.console import (
    READY_LINE,
    Console,
    console_env,
    embedded_servers_of,
    gone,
    status,
    web_port,
)

FIRST_RUN_LINE = "Demo login:"  # printed by seed_demo, on the first run only
METRICS_TOKEN = "serve-test-metrics-token"


@pytest.fixture
def data_dir() -> Iterator[Path]:
    # Short, under /tmp: the PostgreSQL socket lives in it and socket paths are limited to ~107 bytes.
    path = Path(tempfile.mkdtemp(prefix="sb-serve-")).resolve()
    yield path / "data"
    shutil.rmtree(path, ignore_errors=True)


def _run_once(data_dir: Path, *, first_run: bool) -> None:
    port = web_port()
    env = console_env(data_dir, METRICS_TOKEN=METRICS_TOKEN)
    serve = Console(
        [sys.executable, "manage.py", "serve", "--port", str(port)], data_dir, port, env
    )
    try:
        serve.wait_ready()
        assert f"{READY_LINE} {serve.url}" in serve.output

        commands = [" ".join(p.cmdline()) for p in serve.descendants if not gone(p)]
        assert any("uvicorn" in c for c in commands), commands
        assert any("celery" in c and " worker" in c for c in commands), commands
        assert any("celery" in c and " beat" in c for c in commands), commands
        postmaster_pid = int((data_dir / "pg" / "postmaster.pid").read_text().split()[0])
        postmaster = psutil.Process(postmaster_pid)
        valkey_port = int((data_dir / "valkey" / "port").read_text())
        # The leftover check below must be able to see these servers while they run.
        # The names as listed: a backend or autovacuum worker of the server may exit before a
        # second read of its /proc entry (CI of ffcf2f9).
        names = [p.info["name"] for p in embedded_servers_of(data_dir)]
        assert any("postgres" in n for n in names) and any("valkey" in n for n in names), names

        if first_run:
            assert FIRST_RUN_LINE in serve.output, serve.output
        else:
            assert FIRST_RUN_LINE not in serve.output, "seeded a second time:\n" + serve.output

        assert status(serve.url + "admin/login/") == 200
        assert status(serve.url + "metrics") == 401
        authorized = {"Authorization": f"Bearer {METRICS_TOKEN}"}
        assert status(serve.url + "metrics", authorized) == 200

        code = serve.stop()
        assert code == 0, serve.output

        _, alive = psutil.wait_procs([*serve.descendants, postmaster], timeout=10)
        alive = [p for p in alive if not gone(p)]
        assert not alive, f"left running after serve exited: {alive}"
        assert not embedded_servers_of(data_dir)
        assert not (data_dir / "pg" / "postmaster.pid").exists()
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", valkey_port), timeout=1).close()
    finally:
        serve.kill_everything()


def test_serve_runs_stops_cleanly_and_restarts_on_the_same_data(data_dir: Path) -> None:
    _run_once(data_dir, first_run=True)
    _run_once(data_dir, first_run=False)
