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


def _on_fresh_cluster(data_dir: Path, argv: list[str]) -> subprocess.CompletedProcess[str]:
    """``python argv`` from the checkout with ``data_dir`` as its data folder and nothing
    external configured, so it starts (and on exit stops) an embedded cluster of its own."""
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env["SWITCHBOARD_DATA_DIR"] = str(data_dir)
    env["PYTHONPATH"] = str(BASE_DIR)
    return subprocess.run(
        [sys.executable, *argv],
        cwd=BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_a_manage_py_command_starts_and_stops_the_embedded_database() -> None:
    data_dir = Path(tempfile.mkdtemp(prefix="sb-embedded-"))
    try:
        for argv in (["migrate", "-v0"], ["showmigrations", "queues"]):
            done = _on_fresh_cluster(data_dir, ["manage.py", *argv])
            assert done.returncode == 0, done.stderr
        assert "[X] 0001_initial" in done.stdout
        assert (data_dir / "pg" / "PG_VERSION").exists()
        # The command held the only handle, so the server stopped with it.
        assert _postgres_of(data_dir) == []
    finally:
        for proc in _postgres_of(data_dir):
            proc.kill()


# Run in a process of its own against its own cluster: ALTER SYSTEM of the test run's server
# would outlast the run.
CLUSTER_PICKS_IT_UP = """
import subprocess
import sys
import time

import psycopg

from switchboard import embedded

conn = psycopg.connect(embedded.ensure_postgres().url("postgres"), autocommit=True)


def naptime():
    # A new session each time: it reads the configuration the postmaster has reloaded.
    with psycopg.connect(embedded.ensure_postgres().url("postgres")) as c:
        return c.execute("SELECT setting FROM pg_settings WHERE name = 'autovacuum_naptime'").fetchone()[0]


def settle(want):
    deadline = time.monotonic() + 20
    while naptime() != want and time.monotonic() < deadline:
        time.sleep(0.1)
    return naptime()


print("attached", naptime())
conn.execute("ALTER SYSTEM SET autovacuum_naptime = '60'")
conn.execute("SELECT pg_reload_conf()")
print("older", settle("60"))
# A second process attaches to the running server (this one holds it up).
attach = "from switchboard import embedded; embedded.ensure_postgres()"
subprocess.run([sys.executable, "-c", attach], check=True, timeout=120)
print("configured", settle(embedded.CLUSTER_SETTINGS["autovacuum_naptime"]))
conn.close()
"""


def test_the_embedded_cluster_takes_its_settings_new_or_existing() -> None:
    """A new cluster has CLUSTER_SETTINGS when a process attaches; a running one with other
    values takes them by a reload (no restart) when a process attaches."""
    from switchboard.embedded import CLUSTER_SETTINGS

    want = CLUSTER_SETTINGS["autovacuum_naptime"]
    assert want != "60"  # autovacuum's default, which the test sets first
    data_dir = Path(tempfile.mkdtemp(prefix="sb-embedded-"))
    try:
        done = _on_fresh_cluster(data_dir, ["-c", CLUSTER_PICKS_IT_UP])
        assert done.returncode == 0, done.stderr
        assert done.stdout.split("\n") == [
            f"attached {want}",
            "older 60",
            f"configured {want}",
            "",
        ], done.stdout + done.stderr
        assert (
            f"autovacuum_naptime = '{want}'"
            in (data_dir / "pg" / "postgresql.auto.conf").read_text()
        )
    finally:
        for proc in _postgres_of(data_dir):
            proc.kill()
