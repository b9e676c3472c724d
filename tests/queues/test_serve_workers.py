"""`manage.py serve` (`make run`) runs the ready hooks on a worker of their own: asked through
Celery's remote control on the console's own broker, one worker answers that it consumes the
``hooks`` queue and the other the sweeps' ``celery`` queue, and neither consumes both."""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from tests.console import Console, console_env, web_port


@pytest.fixture
def data_dir() -> Iterator[Path]:
    # Short, under /tmp: the PostgreSQL socket lives in it and socket paths are limited to ~107 bytes.
    path = Path(tempfile.mkdtemp(prefix="sb-serve-")).resolve()
    yield path / "data"
    shutil.rmtree(path, ignore_errors=True)


def queues_by_worker(broker_url: str, expected: int, timeout: float = 60.0) -> dict[str, set[str]]:
    """Each worker's node name and the queues it consumes, once ``expected`` workers answer."""
    # Not the current app: the hooks' shared task would follow it to this broker, which stops
    # with the test (tests/conftest.py _process_state_kept).
    control = Celery(broker=broker_url, set_as_current=False)
    answered: dict[str, Any] = {}
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            answered = control.control.inspect(timeout=2).active_queues() or {}
            if len(answered) >= expected:
                break
            time.sleep(0.5)
    finally:
        control.close()
    return {node: {q["name"] for q in queues} for node, queues in answered.items()}


def test_serve_runs_a_worker_for_the_hooks_queue_and_another_for_the_sweeps(
    data_dir: Path,
) -> None:
    port = web_port()
    env = console_env(data_dir)
    serve = Console(
        [sys.executable, "manage.py", "serve", "--port", str(port)], data_dir, port, env
    )
    try:
        serve.wait_ready()
        valkey_port = int((data_dir / "valkey" / "port").read_text())
        workers = queues_by_worker(f"redis://127.0.0.1:{valkey_port}/0", expected=2)
        assert sorted(workers.values(), key=sorted) == [{"celery"}, {"hooks"}], workers
        assert {node.split("@")[0] for node in workers} == {"sweeps", "hooks"}, workers
        serve.assert_up()
        assert serve.stop() == 0, serve.output
    finally:
        serve.kill_everything()
