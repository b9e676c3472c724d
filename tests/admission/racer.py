"""A child process for the two-process claim race (test_race.py): N threads, one claim_next each.

Usage: python -m tests.admission.racer ENDPOINT_ID THREADS SYNC_DIR [START_TIMEOUT]
Environment: DATABASE_URL (the test database), REDIS_URL, DJANGO_SETTINGS_MODULE.
Writes SYNC_DIR/ready-<pid> once every thread holds a connection, waits for SYNC_DIR/go, then
prints one JSON line: {"claimed": [...todo ids], "deferred": [...reasons], "empty": n}.
A thread that cannot connect (a server out of connections) breaks the start: the child exits at
once with that error, and ``race`` stops the other child instead of waiting on it forever.

``race`` is the parent's side: it starts the children, lets them go together and returns their
reports.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any


def say_ready(sync_dir: Path) -> None:
    """This process's threads all hold a connection (SYNC_DIR/ready-<pid>)."""
    (sync_dir / f"ready-{os.getpid()}").touch()


def ready_count(sync_dir: Path) -> int:
    """How many processes have said ``say_ready`` in ``sync_dir``."""
    return len(list(sync_dir.glob("ready-*")))


def main(endpoint_id: str, threads: int, sync_dir: Path, start_timeout: float) -> None:
    import django

    django.setup()
    from django.db import connection, connections

    from queues import services
    from queues.access import AgentActor
    from queues.models import Endpoint

    actor = AgentActor(Endpoint.objects.get(pk=endpoint_id))
    connections.close_all()
    results: list[Any] = []
    errors: list[str] = []
    lock = threading.Lock()
    connected = threading.Barrier(threads + 1, timeout=start_timeout)
    go = threading.Event()
    abandoned = threading.Event()

    def racer(i: int) -> None:
        try:
            try:
                connection.ensure_connection()
            except BaseException:
                connected.abort()  # the others, and main, stop waiting for this one
                raise
            connected.wait()
            go.wait()
            if abandoned.is_set():
                return
            result = services.claim_next(actor=actor, claimant=f"{os.getpid()}-{i}")
            with lock:
                results.append(result)
        except Exception as exc:  # reported to the parent
            with lock:
                errors.append(repr(exc))
        finally:
            connections.close_all()

    workers = [threading.Thread(target=racer, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    try:
        connected.wait()
    except threading.BrokenBarrierError:
        for w in workers:
            w.join(start_timeout)
        raise SystemExit(f"a racer could not connect: {errors}") from None
    say_ready(sync_dir)
    deadline = time.monotonic() + start_timeout
    while not (sync_dir / "go").exists():
        if time.monotonic() > deadline:
            abandoned.set()
            go.set()  # each racer returns without claiming
            raise SystemExit("never told to go")
        time.sleep(0.005)
    go.set()
    for w in workers:
        w.join()
    out = {
        "claimed": [str(r.todo.id) for r in results if isinstance(r, services.Claimed)],
        "deferred": [
            d["reason"]
            for r in results
            if isinstance(r, services.NothingClaimable)
            for d in r.deferred
        ],
        "empty": sum(1 for r in results if isinstance(r, services.NothingClaimable)),
        "errors": errors,
    }
    print(json.dumps(out))


ROOT = Path(__file__).resolve().parents[2]


def race(
    endpoint_id: Any,
    threads: int,
    sync_dir: Path,
    database_url: str,
    redis_url: str,
    start_timeout: float = 60.0,
) -> list[dict[str, Any]]:
    """Two child processes of ``threads`` claimers each, released at once; their reports.
    ``start_timeout``: how long a child waits for its threads' connections, then for "go"."""
    from tests.conftest import many_connections_listed  # the pytest process's; not the child's

    many_connections_listed(2 * threads)
    env = {
        **os.environ,
        "DATABASE_URL": database_url,
        "REDIS_URL": redis_url,
        "DJANGO_SETTINGS_MODULE": "switchboard.settings",
    }
    command = [sys.executable, "-m", "tests.admission.racer", str(endpoint_id), str(threads)]
    children = [
        subprocess.Popen(
            [*command, str(sync_dir), str(start_timeout)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    try:
        deadline = time.monotonic() + 2 * start_timeout
        while ready_count(sync_dir) < 2:
            if any(c.poll() is not None for c in children) or time.monotonic() > deadline:
                # One child failed to start (or neither got ready): stop both, then read them.
                for c in children:
                    if c.poll() is None:
                        c.kill()
                reports = [c.communicate(timeout=30) for c in children]
                raise AssertionError(f"the racers never got ready: {reports}")
            time.sleep(0.01)
        (sync_dir / "go").touch()
        outputs = [c.communicate(timeout=120) for c in children]
    finally:
        for c in children:
            if c.poll() is None:
                c.kill()
                c.communicate(timeout=30)
    assert [c.returncode for c in children] == [0, 0], outputs
    return [json.loads(out.strip().splitlines()[-1]) for out, _err in outputs]


if __name__ == "__main__":
    main(
        sys.argv[1],
        int(sys.argv[2]),
        Path(sys.argv[3]),
        float(sys.argv[4]) if sys.argv[4:] else 60.0,
    )
