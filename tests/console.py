"""A whole console (`manage.py serve`, or `make run` which execs it) run as a user runs it, on a
data folder of its own, for the tests that drive it from outside: its output collected line by
line, its processes found, and nothing left behind after a failure.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

import psutil
import pytest

BASE_DIR = Path(__file__).resolve().parent.parent
READY_LINE = "Switchboard is running at"
READY_TIMEOUT = 120.0
EXIT_TIMEOUT = 30.0
# What a shell on a fresh machine would not have: the test run's own services and settings.
NOT_INHERITED = (
    "DATABASE_URL",
    "REDIS_URL",
    "XDG_RUNTIME_DIR",
    "METRICS_TOKEN",
    "METRICS_TOKEN_FILE",
    "SWITCHBOARD_PUBLIC_URL",
    "SWITCHBOARD_PORT",
    "VIRTUAL_ENV",
    "PYTHONPATH",
    "MAKEFLAGS",
    "MFLAGS",
    "MAKELEVEL",
)


def web_port() -> int:
    """A free port for the console's web server below the kernel's ephemeral range, as
    ``make run``'s default 8000 is. The embedded Valkey's port is chosen from that range
    (``embedded.free_port``) after the web port was picked and released: taken from the same
    range, both could be the same port (a fresh clone's test_serve: "address already in use")."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    rng = random.Random()
    while True:
        port = rng.randrange(10_000, low)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port


def console_env(data_dir: Path, **extra: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key not in NOT_INHERITED}
    env.update(SWITCHBOARD_DATA_DIR=str(data_dir), PYTHONUNBUFFERED="1", **extra)
    return env


def status(url: str, headers: dict[str, str] | None = None) -> int:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)


def gone(process: psutil.Process) -> bool:
    try:
        return not process.is_running() or process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def embedded_servers_of(data_dir: Path) -> list[psutil.Process]:
    """Running postgres / valkey-server processes that belong to this data folder."""
    found = []
    for process in psutil.process_iter(["name", "cmdline"]):
        try:
            name = process.info["name"] or ""
            if "postgres" not in name and "valkey" not in name:
                continue
            if gone(process):
                continue
            cmdline = " ".join(process.info["cmdline"] or [])
            with contextlib.suppress(psutil.AccessDenied):
                cmdline += " " + process.cwd()
            if str(data_dir) in cmdline:
                found.append(process)
        except psutil.NoSuchProcess:
            continue
    return found


class Console:
    """One run of ``argv`` (``manage.py serve`` or ``make run``), its output collected."""

    def __init__(self, argv: Sequence[str], data_dir: Path, port: int, env: dict[str, str]):
        self.port = port
        self.url = f"http://127.0.0.1:{port}/"
        self.data_dir = data_dir
        self.process = subprocess.Popen(
            list(argv),
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
        self.ready_at = 0.0  # time.monotonic() when the ready line appeared

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
        self.ready_at = time.monotonic()
        self.descendants = psutil.Process(self.process.pid).children(recursive=True)

    def assert_up(self) -> None:
        """Still running, no child lost: else fail with what the console said (a dead worker's
        traceback, say) rather than with whatever broke next."""
        up = self.process.poll() is None and "died unexpectedly" not in self.output
        assert up, "the console stopped or lost a child:\n" + self.output[-8000:]

    def launcher(self) -> psutil.Process:
        """The ``manage.py serve`` process: ours, or the one ``make run`` started."""
        for process in [psutil.Process(self.process.pid), *self.descendants]:
            if "serve" in process.cmdline() and "manage.py" in process.cmdline():
                return process
        raise AssertionError(f"no manage.py serve among {self.descendants}")

    def stop(self) -> int:
        """SIGTERM to the launcher, as Ctrl-C or a service manager sends; our process's status
        (make passes on the launcher's own)."""
        self.launcher().send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=EXIT_TIMEOUT)
        except subprocess.TimeoutExpired:
            pytest.fail(
                f"serve did not exit within {EXIT_TIMEOUT:.0f} s of SIGTERM:\n" + self.output
            )

    def kill_everything(self) -> None:
        """Last resort after a failure: leave no process behind."""
        if self.process.poll() is None:
            with contextlib.suppress(psutil.Error, AssertionError):
                self.launcher().send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=EXIT_TIMEOUT)
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        leftovers = [p for p in self.descendants if not gone(p)]
        leftovers += embedded_servers_of(self.data_dir)
        for process in leftovers:
            with contextlib.suppress(psutil.Error):
                process.terminate()
        _, alive = psutil.wait_procs(leftovers, timeout=5)
        for process in alive:
            with contextlib.suppress(psutil.Error):
                process.kill()
        # The output pipe ends with the last process holding it; the reader then stops, and the
        # pipe is closed (else it is left to the garbage collector: a ResourceWarning).
        self._reader.join(timeout=5)
        if not self._reader.is_alive() and self.process.stdout is not None:
            self.process.stdout.close()
