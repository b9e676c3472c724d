"""Long-lived child processes against the test database: each its own Django and its own
database connection, driven by JSON lines on stdin and answering one JSON line per command."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from django.conf import settings

from tests.conftest import database_url

ROOT = Path(__file__).resolve().parents[1]


class Child:
    """``python -m module`` that prints "ready" once set up, then one line per command."""

    def __init__(self, module: str) -> None:
        env = {
            **os.environ,
            "DATABASE_URL": database_url(),
            "REDIS_URL": settings.REDIS_URL,
            "DJANGO_SETTINGS_MODULE": "switchboard.settings",
        }
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None and self.proc.stdout.readline().strip() == "ready"

    def send(self, command: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()

    def receive(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, f"the child died (exit {self.proc.poll()})"
        result: dict[str, Any] = json.loads(line)
        return result

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(timeout=30)
            if self.proc.stdout is not None:
                self.proc.stdout.close()


@contextmanager
def children(module: str, n: int = 2) -> Iterator[list[Child]]:
    """``n`` children of ``module``, closed however the test ends."""
    started: list[Child] = []
    try:
        for _ in range(n):
            started.append(Child(module))
        yield started
    finally:
        for child in started:
            child.close()
