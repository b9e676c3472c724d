"""A long-lived child process for the randomized admission trials (test_trials.py).

Usage: python -m tests.admission.trial_racer
Environment: DATABASE_URL (the test database), REDIS_URL, DJANGO_SETTINGS_MODULE.
Prints "ready", then for each JSON command line on stdin ({"endpoint", "threads", "ops",
"seed"}, optionally "sync_dir", "parties" and "start_timeout") runs that many threads, each doing ``ops`` random
steps (claim_next, then complete, release, fail, let the lease lapse, or hold), and prints one
JSON line: {"claims": n, "errors": [...]}. Started once per test module, so a hundred trials
do not pay a hundred Django startups.

With "sync_dir" and "parties", the threads start together with the other processes' too: once
every thread holds a connection the process says so in SYNC_DIR (``racer.say_ready``, as the
two-process claim race does) and waits until "parties" processes have (a process told first
would otherwise claim before the other had connected). Past "start_timeout" seconds (default 60)
of waiting every thread reports the error and nothing is claimed.
"""

from __future__ import annotations

import os
import random
import threading
import time
from pathlib import Path
from typing import Any
from uuid import UUID

from tests.admission.racer import ready_count, say_ready
from tests.child_serve import serve

START_TIMEOUT = 60.0


def _start_timeout(command: dict[str, Any]) -> float:
    return float(command.get("start_timeout", START_TIMEOUT))


def _all_connected(command: dict[str, Any]) -> Any:
    """The start barrier's action: with "sync_dir", say this process is connected and wait for
    the other "parties" (an error past the start timeout, which breaks the barrier: every
    thread reports it)."""
    if not command.get("sync_dir"):
        return None
    sync_dir, parties = Path(command["sync_dir"]), int(command["parties"])
    timeout = _start_timeout(command)

    def action() -> None:
        say_ready(sync_dir)
        deadline = time.monotonic() + timeout
        while ready_count(sync_dir) < parties:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{parties} processes never connected in {sync_dir}")
            time.sleep(0.002)

    return action


def run_trial(command: dict[str, Any]) -> dict[str, Any]:
    from django.db import connection, connections

    from queues import services, sql
    from queues.access import AgentActor
    from queues.models import Endpoint

    actor = AgentActor(Endpoint.objects.get(pk=command["endpoint"]))
    connections.close_all()
    threads = int(command["threads"])
    claims: list[int] = [0] * threads
    errors: list[str] = []
    lock = threading.Lock()
    # The barrier's own timeout covers the connects and the rendezvous both.
    start = threading.Barrier(
        threads, action=_all_connected(command), timeout=2 * _start_timeout(command)
    )

    def racer(i: int) -> None:
        rng = random.Random(f"{command['seed']}-{os.getpid()}-{i}")
        try:
            try:
                connection.ensure_connection()
            except BaseException:
                start.abort()  # the others stop waiting for this one
                raise
            start.wait()
            # "hold_s": this process's threads start claiming that much after the other's (a
            # test gives the statement that has won nothing yet a head start; see test_shards).
            time.sleep(float(command.get("hold_s", 0.0)))
            for _ in range(int(command["ops"])):
                got = services.claim_next(actor=actor, claimant=f"{os.getpid()}-{i}")
                if isinstance(got, services.Claimed):
                    claims[i] += 1
                    step = rng.choice(["complete", "complete", "release", "fail", "lapse", "hold"])
                    if step == "complete":
                        services.complete(actor=actor, todo_id=got.todo.id)
                    elif step == "release":
                        services.release(actor=actor, todo_id=got.todo.id)
                    elif step == "fail":
                        services.fail(actor=actor, todo_id=got.todo.id, error="trial")
                    elif step == "lapse":  # the holder goes silent: a takeover may follow
                        with connection.cursor() as cursor:
                            cursor.execute(
                                "UPDATE queues_todo SET lease_expires_at = clock_timestamp() "
                                "- interval '1 second' WHERE id = %s",
                                [got.todo.id],
                            )
                time.sleep(rng.random() * 0.003)
        except Exception as exc:  # reported to the parent
            with lock:
                errors.append(repr(exc))
        finally:
            connections.close_all()

    # "statement": "full" keeps this process's claims off the lean statement (claim_next then
    # runs the full one for gated work), so a test races the two statements against each other;
    # "lean_claims" counts the claims the lean statement made.
    lean = sql.claim_next_lean
    lean_claims = [0]

    def counted(*args: Any, **kwargs: Any) -> Any:
        if command.get("statement") == "full":
            return None
        got = lean(*args, **kwargs)
        if isinstance(got, sql.Candidate) and got.todo is not None:
            with lock:
                lean_claims[0] += 1
        return got

    if command.get("statement") == "lean":
        # Each round starts on the fast path: a refusal in an earlier round (the other process
        # ran the window out first) marked the endpoint gated in this process for 10 s, which
        # would send every claim of the next rounds to the locked path and none to the lean
        # statement (a fresh clone's run on a loaded machine: 'lean': 0 in all six rounds).
        sql._gated_until.pop(UUID(command["endpoint"]), None)
    sql.claim_next_lean = counted
    try:
        workers = [threading.Thread(target=racer, args=(i,)) for i in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    finally:
        sql.claim_next_lean = lean
    return {"claims": sum(claims), "errors": errors, "lean_claims": lean_claims[0]}


if __name__ == "__main__":
    serve(run_trial)
