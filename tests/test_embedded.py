"""Any manage.py command reaches the embedded PostgreSQL with no setup, and leaves nothing behind
when it started the server itself."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil

BASE_DIR = Path(__file__).resolve().parent.parent


def _postgres_of(data_dir: Path) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["name", "cmdline"]):
        cmdline = " ".join(proc.info.get("cmdline") or [])
        if "postgres" in (proc.info.get("name") or "") and str(data_dir) in cmdline:
            found.append(proc)
    return found


def test_a_manage_py_command_starts_and_stops_the_embedded_database() -> None:
    data_dir = Path(tempfile.mkdtemp(prefix="sb-embedded-"))
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env["SWITCHBOARD_DATA_DIR"] = str(data_dir)
    try:
        for argv in (["migrate", "-v0"], ["showmigrations", "queues"]):
            done = subprocess.run(
                [sys.executable, "manage.py", *argv],
                cwd=BASE_DIR,
                env=env,
                capture_output=True,
                text=True,
                timeout=180,
            )
            assert done.returncode == 0, done.stderr
        assert "[X] 0001_initial" in done.stdout
        assert (data_dir / "pg" / "PG_VERSION").exists()
        # The command held the only handle, so the server stopped with it.
        assert _postgres_of(data_dir) == []
    finally:
        for proc in _postgres_of(data_dir):
            proc.kill()
