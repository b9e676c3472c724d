"""`manage.py serve` end to end, on a fresh data folder of its own.

The launcher gets its own embedded PostgreSQL and Valkey (DATABASE_URL and REDIS_URL removed from
its environment), must answer on the admin and /metrics, must stop every child and both embedded
servers on SIGTERM with exit status 0, and must come up again on the same data folder without
seeding twice.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

BASE_DIR = Path(__file__).resolve().parent.parent
READY_LINE = "Switchboard is running at"
FIRST_RUN_LINE = "Demo login:"  # printed by seed_demo, on the first run only
METRICS_TOKEN = "serve-test-metrics-token"
READY_TIMEOUT = 120.0
EXIT_TIMEOUT = 30.0


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _status(url: str, headers: dict[str, str] | None = None) -> int:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)


def _gone(process: psutil.Process) -> bool:
    try:
        return not process.is_running() or process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _embedded_servers_of(data_dir: Path) -> list[psutil.Process]:
    """Running postgres / valkey-server processes that belong to this data folder."""
    found = []
    for process in psutil.process_iter(["name", "cmdline"]):
        try:
            name = process.info["name"] or ""
            if "postgres" not in name and "valkey" not in name:
                continue
            if _gone(process):
                continue
            cmdline = " ".join(process.info["cmdline"] or [])
            with contextlib.suppress(psutil.AccessDenied):
                cmdline += " " + process.cwd()
            if str(data_dir) in cmdline:
                found.append(process)
        except psutil.NoSuchProcess:
            continue
    return found


class Serve:
    """One `manage.py serve` run, its output collected line by line."""

    def __init__(self, data_dir: Path, port: int) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}/"
        env = {
            key: value
            for key, value in os.environ.items()
            if key not in ("DATABASE_URL", "REDIS_URL", "XDG_RUNTIME_DIR")
        }
        env.update(
            SWITCHBOARD_DATA_DIR=str(data_dir),
            METRICS_TOKEN=METRICS_TOKEN,
            PYTHONUNBUFFERED="1",
        )
        self.process = subprocess.Popen(
            [sys.executable, "manage.py", "serve", "--port", str(port)],
            cwd=BASE_DIR,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            start_new_session=True,
        )
        self._lines: list[str] = []
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.descendants: list[psutil.Process] = []

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            with self._lock:
                self._lines.append(line)

    @property
    def output(self) -> str:
        with self._lock:
            return "".join(self._lines)

    def wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT
        while READY_LINE not in self.output:
            if self.process.poll() is not None:
                time.sleep(0.5)  # let the reader catch the last lines
                pytest.fail(
                    f"serve exited with {self.process.returncode} before it was ready:\n"
                    + self.output
                )
            if time.monotonic() > deadline:
                pytest.fail(f"serve was not ready within {READY_TIMEOUT:.0f} s:\n" + self.output)
            time.sleep(0.2)
        self.descendants = psutil.Process(self.process.pid).children(recursive=True)

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=EXIT_TIMEOUT)
        except subprocess.TimeoutExpired:
            pytest.fail(
                f"serve did not exit within {EXIT_TIMEOUT:.0f} s of SIGTERM:\n" + self.output
            )

    def kill_everything(self, data_dir: Path) -> None:
        """Last resort after a failure: leave no process behind."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=EXIT_TIMEOUT)
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        leftovers = [p for p in self.descendants if not _gone(p)]
        leftovers += _embedded_servers_of(data_dir)
        for process in leftovers:
            with contextlib.suppress(psutil.Error):
                process.terminate()
        _, alive = psutil.wait_procs(leftovers, timeout=5)
        for process in alive:
            with contextlib.suppress(psutil.Error):
                process.kill()


@pytest.fixture
def data_dir() -> Iterator[Path]:
    # Short, under /tmp: the PostgreSQL socket lives in it and socket paths are limited to ~107 bytes.
    path = Path(tempfile.mkdtemp(prefix="sb-serve-")).resolve()
    yield path / "data"
    shutil.rmtree(path, ignore_errors=True)


def _run_once(data_dir: Path, *, first_run: bool) -> None:
    serve = Serve(data_dir, _free_port())
    try:
        serve.wait_ready()
        assert f"{READY_LINE} {serve.url}" in serve.output

        commands = [" ".join(p.cmdline()) for p in serve.descendants if not _gone(p)]
        assert any("uvicorn" in c for c in commands), commands
        assert any("celery" in c and " worker" in c for c in commands), commands
        assert any("celery" in c and " beat" in c for c in commands), commands
        postmaster_pid = int((data_dir / "pg" / "postmaster.pid").read_text().split()[0])
        postmaster = psutil.Process(postmaster_pid)
        valkey_port = int((data_dir / "valkey" / "port").read_text())
        # The leftover check below must be able to see these servers while they run.
        names = [p.name() for p in _embedded_servers_of(data_dir)]
        assert any("postgres" in n for n in names) and any("valkey" in n for n in names), names

        if first_run:
            assert FIRST_RUN_LINE in serve.output, serve.output
        else:
            assert FIRST_RUN_LINE not in serve.output, "seeded a second time:\n" + serve.output

        assert _status(serve.url + "admin/login/") == 200
        assert _status(serve.url + "metrics") == 401
        authorized = {"Authorization": f"Bearer {METRICS_TOKEN}"}
        assert _status(serve.url + "metrics", authorized) == 200

        code = serve.stop()
        assert code == 0, serve.output

        _, alive = psutil.wait_procs([*serve.descendants, postmaster], timeout=10)
        alive = [p for p in alive if not _gone(p)]
        assert not alive, f"left running after serve exited: {alive}"
        assert not _embedded_servers_of(data_dir)
        assert not (data_dir / "pg" / "postmaster.pid").exists()
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", valkey_port), timeout=1).close()
    finally:
        serve.kill_everything(data_dir)


def test_serve_runs_stops_cleanly_and_restarts_on_the_same_data(data_dir: Path) -> None:
    _run_once(data_dir, first_run=True)
    _run_once(data_dir, first_run=False)
