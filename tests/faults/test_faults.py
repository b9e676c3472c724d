"""Faults under load: a PostgreSQL restart, a Valkey freeze (SIGSTOP) and a Valkey kill while
agents create, claim and complete over HTTP; a claiming process killed with SIGKILL. Afterwards
the books must balance: nothing acknowledged is lost, nothing is claimed twice at once, no claim
is made for a client that gave up (or was told 503), counters equal the database, and the ledger
verifies. While a dependency is down every answer is fast and machine-readable."""

from __future__ import annotations

import http.client
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import redis

from tests.faults.conftest import BASE_DIR, METRICS_TOKEN, Stack

CLIENT_TIMEOUT = 4.0  # seconds an agent waits before it gives up on a request
AGENTS = 4


@dataclass
class Sent:
    verb: str
    started: float
    seconds: float
    status: int | str  # an HTTP status, or "timeout" / "error" when no answer came
    body: dict[str, Any] = field(default_factory=dict)
    claimant: str | None = None


class Agent:
    def __init__(self, base: str, token: str) -> None:
        url = urlsplit(base)
        self.host, self.port = url.hostname or "127.0.0.1", url.port
        self.token = token
        self.conn: http.client.HTTPConnection | None = None

    def send(self, verb: str, body: dict[str, Any], claimant: str | None = None) -> Sent:
        started = time.monotonic()
        status: int | str
        answer: dict[str, Any] = {}
        try:
            if self.conn is None:
                self.conn = http.client.HTTPConnection(self.host, self.port, timeout=CLIENT_TIMEOUT)
            self.conn.request(
                "POST",
                f"/api/v1/agent/{verb}",
                json.dumps(body),
                {"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
            )
            response = self.conn.getresponse()
            raw = response.read()
            status = response.status
            assert response.getheader("Content-Type", "").startswith("application/json"), raw
            answer = json.loads(raw)
            if status == 503:
                assert answer["code"] == "unavailable" and response.getheader("Retry-After")
        except TimeoutError:
            status = "timeout"
            self._reset()
        except (OSError, http.client.HTTPException):
            status = "error"
            self._reset()
        return Sent(verb, started, time.monotonic() - started, status, answer, claimant)

    def _reset(self) -> None:
        if self.conn is not None:
            self.conn.close()
        self.conn = None

    close = _reset


def drive(agent: Agent, log: list[Sent], stop: threading.Event) -> None:
    """Create a todo, claim the next, complete what was claimed; again until told to stop."""
    n = 0
    while not stop.is_set():
        n += 1
        log.append(agent.send("create_todo", {"queue": "work", "title": f"t{n}"}))
        claimant = uuid.uuid4().hex
        sent = agent.send("claim_next", {"queue": "work", "claimant": claimant}, claimant)
        log.append(sent)
        if sent.status == 200 and not sent.body.get("empty"):
            todo, attempt = sent.body["todo"]["id"], sent.body["attempt"]
            log.append(agent.send("complete", {"id": todo, "attempt": attempt}))


def scrape(base: str) -> tuple[float, int, str]:
    url = urlsplit(base)
    conn = http.client.HTTPConnection(url.hostname or "", url.port, timeout=10)
    try:
        started = time.monotonic()
        conn.request("GET", "/metrics", headers={"Authorization": f"bearer {METRICS_TOKEN}"})
        response = conn.getresponse()
        text = response.read().decode()
        return time.monotonic() - started, response.status, text
    finally:
        conn.close()


@dataclass
class Window:
    name: str
    start: float
    end: float = 0.0


def fault(windows: list[Window], name: str, begin: Callable[[], None], end: Callable[[], None],
          hold: float, probes: list[tuple[str, float, int, str]], base: str) -> None:  # fmt: skip
    window = Window(name, time.monotonic())
    windows.append(window)
    begin()
    time.sleep(hold / 2)
    probes.append((name, *scrape(base)))
    time.sleep(hold / 2)
    end()
    window.end = time.monotonic()


def test_the_books_balance_through_a_postgres_restart_and_a_valkey_freeze_and_kill(
    stack: Stack,
) -> None:
    log: list[Sent] = []
    stop = threading.Event()
    agents = [Agent(stack.base, stack.tokens["load"]) for _ in range(AGENTS)]
    threads = [threading.Thread(target=drive, args=(a, log, stop)) for a in agents]
    for t in threads:
        t.start()
    windows: list[Window] = []
    probes: list[tuple[str, float, int, str]] = []
    vk = stack.valkey
    try:
        time.sleep(2)
        fault(windows, "postgres restart", stack.postgres.stop, stack.postgres.start, 3, probes,
              stack.base)  # fmt: skip
        time.sleep(2)
        fault(windows, "valkey frozen", lambda: vk.signal(signal.SIGSTOP),
              lambda: vk.signal(signal.SIGCONT), 4, probes, stack.base)  # fmt: skip
        time.sleep(2)
        fault(windows, "valkey killed", vk.kill, vk.start, 3, probes, stack.base)
        time.sleep(2)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
        for a in agents:
            a.close()

    # Let the last claims finish and every buffered counter reach Redis.
    books = reconcile(stack, log)
    during = [s for s in log if any(w.start <= s.started <= w.end for w in windows)]
    worst = max((s.seconds for s in during), default=0.0)
    report = {
        "requests": len(log),
        "5xx": sum(1 for s in log if isinstance(s.status, int) and s.status >= 500),
        "503_unavailable": sum(1 for s in log if s.status == 503),
        "non_503_5xx": sum(
            1 for s in log if isinstance(s.status, int) and s.status in (500, 502, 504)
        ),
        "no_answer": sum(1 for s in log if isinstance(s.status, str)),
        "worst_latency_while_down_s": round(worst, 3),
        "metrics_while_down_s": {name: round(sec, 3) for name, sec, _, _ in probes},
        **books,
    }
    print("FAULTS " + json.dumps(report, sort_keys=True))
    if os.environ.get("FAULTS_REPORT"):
        with open(os.environ["FAULTS_REPORT"], "w") as out:
            json.dump(report, out, indent=2, sort_keys=True)

    assert report["non_503_5xx"] == 0, [s for s in log if s.status == 500][:3]
    assert books["orphan_claims"] == 0
    assert books["claims_after_refusal"] == 0
    assert books["lost_creates"] == 0 and books["lost_completes"] == 0
    assert books["overlapping_claims"] == 0
    assert books["counter_drift"] == 0, books
    assert books["ledger_verifies"]
    # Fast and clean while down: the client never had to give up, and /metrics answered in 5 s.
    assert report["no_answer"] == 0, [s for s in log if isinstance(s.status, str)][:3]
    assert worst < CLIENT_TIMEOUT
    for name, seconds, status, _ in probes:
        assert seconds < 5 and status == 200, (name, seconds, status)
    assert sum(1 for s in log if s.status == 200) > 50  # the load really ran


def reconcile(stack: Stack, log: list[Sent]) -> dict[str, Any]:
    created = {s.body["todo"]["id"] for s in log if s.verb == "create_todo" and s.status == 200}
    completed = {s.body["todo"]["id"] for s in log if s.verb == "complete" and s.status == 200}
    departed = {s.claimant for s in log if s.verb == "claim_next" and isinstance(s.status, str)}
    refused = {s.claimant for s in log if s.verb == "claim_next" and s.status != 200} - departed
    rows = stack.sql("SELECT id::text, state FROM queues_todo")
    state = dict(rows)
    # Every claim made: the ended attempts' rows and the claims in progress (the todos').
    attempts = stack.sql(
        "SELECT todo_id::text, number, claimant, claimed_at, LEAST(lease_expires_at, ended_at) "
        "FROM queues_attempt UNION ALL "
        "SELECT id::text, attempt, owner, claimed_at, lease_expires_at "
        "FROM queues_todo WHERE state = 'claimed' ORDER BY 1, 2"
    )
    overlapping = 0
    for before, after in itertools.pairwise(attempts):
        if before[0] == after[0] and after[3] < before[4]:
            overlapping += 1
    claimants = {a[2] for a in attempts}
    received: dict[tuple[str, int], int] = {}
    for s in log:
        if s.verb == "claim_next" and s.status == 200 and not s.body.get("empty"):
            key = (s.body["todo"]["id"], s.body["attempt"])
            received[key] = received.get(key, 0) + 1

    drift = counter_drift(stack)
    verify = stack.manage("ledger", "verify", "--json")
    return {
        "lost_creates": len(created - set(state)),
        "lost_completes": sum(1 for t in completed if state.get(t) != "done"),
        "orphan_claims": len(departed & claimants),
        "claims_after_refusal": len(refused & claimants),
        "overlapping_claims": overlapping + sum(1 for n in received.values() if n > 1),
        "counter_drift": drift,
        "ledger_verifies": verify.returncode == 0,
        "todos": len(state),
        "attempts": len(attempts),
    }


def counter_drift(stack: Stack) -> int:
    """|Redis counters - database| over created, claimed and completed, once the web process
    has flushed (its breaker may hold flushes for a few seconds after the last fault)."""
    with redis.Redis.from_url(stack.valkey.url) as client:
        return _drift(stack, client)


def _drift(stack: Stack, client: redis.Redis) -> int:
    drift = -1
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        truth = stack.sql(
            "SELECT (SELECT count(*) FROM queues_todo), (SELECT count(*) FROM queues_attempt)"
            " + (SELECT count(*) FROM queues_todo WHERE state = 'claimed'), "
            "(SELECT count(*) FROM queues_todo WHERE state = 'done')"
        )[0]
        counted = [
            sum(int(v) for v in client.hvals(f"switchboard:counter:{name}"))
            for name in ("switchboard_todos_created_total", "switchboard_todos_claimed_total")
        ]
        done = sum(
            int(v)
            for k, v in client.hgetall(
                "switchboard:counter:switchboard_todos_completed_total"
            ).items()
            if b'"outcome":"done"' in k
        )
        drift = sum(abs(a - b) for a, b in zip([*counted, done], truth, strict=True))
        if drift == 0:
            return 0
        time.sleep(0.5)
    return drift


DOOMED = """
import sys
from queues import services
from queues.models import Endpoint
from queues.access import AgentActor
actor = AgentActor(Endpoint.objects.get(name="doomed"), via="api")
for n in range(10):
    services.todo_create(actor=actor, endpoint=actor.endpoint, queue="work", title=f"d{n}")
for n in range(10):
    got = services.claim_next(actor=actor, lease_ttl_seconds=1, claimant=f"doomed-{n}")
    print(got.todo.id, flush=True)
    if n == 4:
        print("holding", flush=True)
        import time; time.sleep(60)
"""


def test_a_claiming_process_killed_mid_work_loses_nothing(stack: Stack) -> None:
    claimer = subprocess.Popen(
        [sys.executable, "manage.py", "shell", "-c", DOOMED],
        cwd=BASE_DIR,
        env=stack.env,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert claimer.stdout is not None
    held = []
    for line in claimer.stdout:
        if line.strip() == "holding":
            break
        if len(line.strip()) == 36:  # a todo id (the shell prints a banner first)
            held.append(line.strip())
    os.kill(claimer.pid, signal.SIGKILL)
    claimer.wait(timeout=10)
    claimer.stdout.close()
    assert len(held) == 5

    # Another agent of the same endpoint drains the queue: the dead process's claims come back
    # once their leases lapse (1 s), and each is taken over exactly once.
    token = stack.tokens["doomed"]
    agent = Agent(stack.base, token)
    done: set[str] = set()
    deadline = time.monotonic() + 30
    while len(done) < 10 and time.monotonic() < deadline:
        sent = agent.send("claim_next", {"queue": "work"})
        assert sent.status == 200, sent
        if sent.body["empty"]:
            time.sleep(0.3)
            continue
        todo, attempt = sent.body["todo"]["id"], sent.body["attempt"]
        if todo in held:
            assert attempt == 2
        assert agent.send("complete", {"id": todo, "attempt": attempt}).status == 200
        done.add(todo)
    assert set(held) <= done and len(done) == 10
    stale = agent.send("complete", {"id": held[0], "attempt": 1})
    agent.close()
    assert stale.status == 409 and stale.body["code"] == "conflict"
