"""What an agent's claim cycle costs the web process per protocol (issue 11): claim_next then
complete, as REST and as MCP (2026-07-28 ``tools/call``), through the server's own request
handling (``OneHopHandler._respond_agent``, the agents' lean path) in one thread, no sockets.

``python -m bench.agent_path_profile [--rounds R] [--cycles N] [--agents A] [--stub]
[--profile KIND]`` against its own bench database (BENCH_DATABASE, as ``python -m bench``).
Blocks of N cycles alternate REST, MCP, REST, …; each block's figure is the thread's CPU time
per cycle (time waiting for PostgreSQL is not counted, so the figure is the web process's
share), and the medians are printed with MCP - REST. ``--agents A``: A threads at once, each
an agent running N cycles, as the server's worker threads serve A clients (the figure is then
the process's CPU per cycle: the threads' hand-offs of the GIL included).

The endpoint watch's share is printed apart (``queues.auth.endpoint_watch``: the empty
statement a cached token lookup waits for, the revoke bound): statements per request and
their thread CPU per cycle. In one thread every request sends its own; with several agents a
statement answers for every request that arrived before it was sent, so fewer are sent.

``--stub``: the operation and the token lookup replaced by a fixed answer, leaving the
protocols' own work. ``--profile rest|mcp``: cProfile one more block (thread CPU time) to
``agent-path-<kind>.prof``. Not a benchmark: ``python -m bench --only http`` measures; this
ranks where the CPU goes, with less noise than a loaded machine's HTTP runs. To compare two
checkouts, run it in each (``git archive``), interleaved.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

MODERN = "2026-07-28"
META = {
    "io.modelcontextprotocol/protocolVersion": MODERN,
    "io.modelcontextprotocol/clientCapabilities": {},
}
KINDS = ("rest", "mcp")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.agent_path_profile")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--cycles", type=int, default=300, help="cycles per block (per agent)")
    parser.add_argument("--agents", type=int, default=1, help="agents (threads) at once")
    parser.add_argument("--stub", action="store_true", help="no operation or token lookup")
    parser.add_argument("--profile", choices=KINDS, help="cProfile one more block")
    args = parser.parse_args(argv)
    from bench.__main__ import standalone

    return standalone(lambda: _run(args))


class _Agent:
    """One agent's requests, handed to the server's handler as uvicorn hands them."""

    def __init__(self, handler: Any, slug: str, token: str) -> None:
        self.handler = handler
        self.slug = slug
        self.token = token

    def call(self, kind: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        from switchboard.asgi import ARRIVED

        headers = [(b"host", b"127.0.0.1:8000"), (b"content-type", b"application/json")]
        headers.append((b"authorization", f"Bearer {self.token}".encode()))
        if kind == "rest":
            path = f"/api/v1/agent/{name}"
            body = json.dumps(arguments).encode()
        else:
            path = f"/mcp/{self.slug}"
            params = {"name": name, "arguments": arguments, "_meta": META}
            message = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}
            body = json.dumps(message).encode()
            headers += [
                (b"accept", b"application/json, text/event-stream"),
                (b"mcp-protocol-version", MODERN.encode()),
                (b"mcp-method", b"tools/call"),
                (b"mcp-name", name.encode()),
            ]
        headers.append((b"content-length", str(len(body)).encode()))
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": b"",
            "root_path": "",
            "headers": headers,
            "client": ("127.0.0.1", 50000),
            "server": ("127.0.0.1", 8000),
            ARRIVED: time.monotonic(),
        }
        route = self.handler.agent_path.route(scope)
        assert route is not None, path  # the lean path serves it
        answer = self.handler._respond_agent(scope, io.BytesIO(body), route)
        content = getattr(answer, "body", None)
        out = json.loads(answer.content if content is None else content)
        if kind == "rest":
            return dict(out)
        assert not out["result"]["isError"], out
        return dict(out["result"]["structuredContent"])

    def cycle(self, kind: str) -> None:
        claimed = self.call(kind, "claim_next", {})
        self.call(kind, "complete", {"id": claimed["todo"]["id"]})


def _run(args: argparse.Namespace) -> None:
    from django.contrib.auth.models import User

    from bench.http_bench import ENDPOINT_RPS, QUEUE, _load_switchboard
    from queues import services
    from queues.access import AgentActor, SystemActor
    from queues.models import Todo
    from switchboard.asgi import OneHopHandler

    owner, _ = User.objects.get_or_create(username="bench-agent-path-owner")
    # The HTTP bench's finite rate: every request pays the rate limiter, as it does there.
    endpoint, token = services.endpoint_vend(
        actor=SystemActor(via="bench"),
        owner=owner,
        name="agent path",
        queues=[QUEUE],
        rps=ENDPOINT_RPS,
    )
    agent = _Agent(OneHopHandler(threads=0, agent_threads=0), endpoint.slug, token)
    load: Callable[[int], None] = lambda n: _load_switchboard(endpoint, n)  # noqa: E731
    if args.stub:
        load = _stub(AgentActor(endpoint=endpoint, via="api"), agent, load)

    watch = _WatchCount()
    agents = max(1, args.agents)

    def block(kind: str, n: int) -> float:
        load(n * agents + 10)
        watch.reset()
        if agents == 1:
            began = time.thread_time()
            for _ in range(n):
                agent.cycle(kind)
            spent = time.thread_time() - began
        else:
            spent = _at_once(agent, kind, n, agents)
        watch.blocks[kind].append(watch.totals(n * agents))
        return spent / (n * agents) * 1e6

    try:
        for kind in KINDS:  # warm: imports, prepared statements, the caches
            block(kind, 50)
        spent: dict[str, list[float]] = {kind: [] for kind in KINDS}
        watch.blocks = {kind: [] for kind in KINDS}
        for _ in range(args.rounds):
            for kind in KINDS:
                spent[kind].append(block(kind, args.cycles))
        medians = {kind: statistics.median(v) for kind, v in spent.items()}
        label = "stubbed " if args.stub else ""
        label += f"{agents} agents at once, process " if agents > 1 else ""
        for kind, values in spent.items():
            runs = ", ".join(f"{v:.0f}" for v in values)
            print(f"{kind}: {label}CPU µs per cycle, median {medians[kind]:.0f} ({runs})")
        print(f"mcp - rest: {medians['mcp'] - medians['rest']:.0f} µs per cycle")
        for kind, counts in watch.blocks.items():
            per_request = statistics.median(c[0] for c in counts)
            cpu = statistics.median(c[1] for c in counts)
            print(
                f"{kind}: endpoint watch, {per_request:.2f} statements per request, "
                f"{cpu:.0f} µs of their threads' CPU per cycle"
            )
        if args.profile:
            import cProfile

            load(args.cycles + 10)
            profile = cProfile.Profile(time.thread_time)
            profile.enable()
            for _ in range(args.cycles):
                agent.cycle(args.profile)
            profile.disable()
            profile.dump_stats(f"agent-path-{args.profile}.prof")
            print(f"-> agent-path-{args.profile}.prof")
    finally:
        Todo.objects.filter(endpoint=endpoint).delete()
        endpoint.delete()


def _at_once(agent: _Agent, kind: str, n: int, agents: int) -> float:
    """``agents`` threads, each running ``n`` cycles; the process's CPU seconds meanwhile."""
    import threading

    from django.db import connection

    start = threading.Barrier(agents + 1)
    failed: list[BaseException] = []

    def run() -> None:
        try:
            start.wait()
            for _ in range(n):
                agent.cycle(kind)
        except BaseException as exc:  # reported below
            failed.append(exc)
        finally:
            connection.close()  # what this thread kept goes back to the pool

    threads = [threading.Thread(target=run) for _ in range(agents)]
    for thread in threads:
        thread.start()
    began = time.process_time()
    start.wait()
    for thread in threads:
        thread.join()
    spent = time.process_time() - began
    if failed:
        raise failed[0]
    return spent


class _WatchCount:
    """The endpoint watch's empty statements (``_EndpointWatch._ask``) and the thread CPU of
    waiting for one (``ready``, the statement included)."""

    def __init__(self) -> None:
        import threading

        from queues.auth import endpoint_watch

        self.lock = threading.Lock()
        self.asked = 0
        self.cpu = 0.0
        self.blocks: dict[str, list[tuple[float, float]]] = {kind: [] for kind in KINDS}
        ask, ready = endpoint_watch._ask, endpoint_watch.ready

        def asked(conn: Any) -> bool:
            with self.lock:
                self.asked += 1
            return ask(conn)

        def timed(since: float | None = None) -> bool:
            began = time.thread_time()
            try:
                return ready(since)
            finally:
                spent = time.thread_time() - began
                with self.lock:
                    self.cpu += spent

        endpoint_watch._ask = asked  # type: ignore[method-assign]
        endpoint_watch.ready = timed  # type: ignore[method-assign]

    def reset(self) -> None:
        with self.lock:
            self.asked, self.cpu = 0, 0.0

    def totals(self, cycles: int) -> tuple[float, float]:
        """(statements per request, their µs of CPU per cycle); two requests a cycle."""
        with self.lock:
            return self.asked / (2 * cycles), self.cpu / cycles * 1e6


def _stub(actor: Any, agent: _Agent, load: Callable[[int], None]) -> Callable[[int], None]:
    """Replace the operation and the token lookup by a claimed todo's answer (this process
    only): what is left is each protocol's own handling."""
    import switchboard.api as agent_api
    import switchboard.mcp as mcp
    from switchboard.core import verbs

    load(5)
    spec = verbs.get("claim_next")
    assert spec is not None
    claimed = verbs.call(actor, spec, spec.input())
    answers = {"claim_next": claimed, "complete": {"todo": claimed["todo"]}}
    agent_api.agent_for_verb = lambda token, spec: actor
    mcp.authenticate_agent = lambda request, token, **kw: actor
    mcp.check_endpoint_rate = lambda endpoint: None
    verbs.call = lambda actor, spec, data: answers[spec.name]
    # REST answers JSON text (verbs.call_json): the same answers, written once here.
    texts = {
        name: json.dumps(answer, separators=(",", ":")).encode() for name, answer in answers.items()
    }
    verbs.call_json = lambda actor, spec, data: texts[spec.name]
    return lambda n: None


if __name__ == "__main__":
    raise SystemExit(main())
