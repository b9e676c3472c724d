"""What an agent's claim cycle costs the web process per protocol (issue 11): claim_next then
complete, as REST and as MCP (2026-07-28 ``tools/call``), through the server's own request
handling (``OneHopHandler._respond_agent``, the agents' lean path) in one thread, no sockets.

``python -m bench.agent_path_profile [--rounds R] [--cycles N] [--stub] [--profile KIND]``
against its own bench database (BENCH_DATABASE, as ``python -m bench``). Blocks of N cycles
alternate REST, MCP, REST, …; each block's figure is the thread's CPU time per cycle (time
waiting for PostgreSQL is not counted, so the figure is the web process's share), and the
medians are printed with MCP - REST. ``--stub``: the operation and the token lookup replaced by
a fixed answer, leaving the protocols' own work. ``--profile rest|mcp``: cProfile one more
block (thread CPU time) to ``agent-path-<kind>.prof``. Not a benchmark: ``python -m bench
--only http`` measures; this ranks where the CPU goes, with less noise than a loaded machine's
HTTP runs. To compare two checkouts, run it in each (``git archive``), interleaved.
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
    parser.add_argument("--cycles", type=int, default=300, help="cycles per block")
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

    from bench.http_bench import QUEUE, _load_switchboard
    from queues import services
    from queues.access import AgentActor, SystemActor
    from queues.models import Todo
    from switchboard.asgi import OneHopHandler

    owner, _ = User.objects.get_or_create(username="bench-agent-path-owner")
    endpoint, token = services.endpoint_vend(
        actor=SystemActor(via="bench"), owner=owner, name="agent path", queues=[QUEUE], rps=0
    )
    agent = _Agent(OneHopHandler(threads=0), endpoint.slug, token)
    load: Callable[[int], None] = lambda n: _load_switchboard(endpoint, n)  # noqa: E731
    if args.stub:
        load = _stub(AgentActor(endpoint=endpoint, via="api"), agent, load)

    def block(kind: str, n: int) -> float:
        load(n + 10)
        began = time.thread_time()
        for _ in range(n):
            agent.cycle(kind)
        return (time.thread_time() - began) / n * 1e6

    try:
        for kind in KINDS:  # warm: imports, prepared statements, the caches
            block(kind, 50)
        spent: dict[str, list[float]] = {kind: [] for kind in KINDS}
        for _ in range(args.rounds):
            for kind in KINDS:
                spent[kind].append(block(kind, args.cycles))
        medians = {kind: statistics.median(v) for kind, v in spent.items()}
        label = "stubbed " if args.stub else ""
        for kind, values in spent.items():
            runs = ", ".join(f"{v:.0f}" for v in values)
            print(f"{kind}: {label}CPU µs per cycle, median {medians[kind]:.0f} ({runs})")
        print(f"mcp - rest: {medians['mcp'] - medians['rest']:.0f} µs per cycle")
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
    return lambda n: None


if __name__ == "__main__":
    raise SystemExit(main())
