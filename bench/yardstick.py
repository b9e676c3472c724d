"""Issue 11's own yardstick beside this repository's, in one run: ``../shared/bench/http-anchor/``.

``python -m bench.yardstick [--anchor DIR] [--repeats N] [--duration S]``. The anchor is the
issue's "minimal async server": its ``app.py`` in a virtualenv made exactly as its README says
(the ``pip install`` line read from that README, so the anchor is what the issue measured, not
this repository's install of the same packages), its own table loaded by its ``load.py``. Five
servers of one process each — the anchor, ``bench/http_baseline.py`` (the same idea on this
repository's uvicorn: ``bench_baseline``; and on the anchor's stack, h11 and asyncio's loop:
``anchor_stack``, as ``python -m bench --only http`` runs it), Switchboard's REST and its MCP — are driven by two clients, the anchor's
``client.mjs`` (``fetch``) and ``bench/http_client.mjs`` (``node:http``), interleaved and
repeated; medians. Every run reports the server's and the client's CPU per cycle, so a client
that is the bottleneck shows, and PostgreSQL's. Ratios are given against both yardsticks.

Not part of ``make bench``: the anchor lives outside this repository and installs its own
packages. ``python -m bench --only http`` is the bench of record; this module says how its
stricter yardstick compares with the issue's.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DEFAULT_ANCHOR = HERE.parent.parent / "shared" / "bench" / "http-anchor"
ANCHOR_TOKEN = "anchor"
CLIENTS = (1, 8)


def anchor_venv(anchor: Path) -> Path:
    """The anchor's virtualenv, made once per install line under .data/ (its README's command)."""
    readme = (anchor / "README.md").read_text()
    match = re.search(r"pip install ([^\n&|;]+)", readme)
    if match is None:
        raise RuntimeError(f"no 'pip install' line in {anchor / 'README.md'}")
    packages = shlex.split(match.group(1).split("#", 1)[0])
    key = re.sub(r"[^a-z0-9]+", "-", " ".join(packages).lower()).strip("-")
    venv = HERE.parent / ".data" / "anchor-venv" / key
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q", *packages],
            check=True,
        )
    return venv


@contextmanager
def _anchor_server(anchor: Path, venv: Path, dsn: str) -> Iterator[tuple[str, int]]:
    from bench import http_bench

    uvicorn = [str(venv / "bin" / "uvicorn"), "app:app"]
    with http_bench.uvicorn_server(uvicorn, anchor, {"DSN": dsn, "TOKEN": ANCHOR_TOKEN}) as server:
        yield server


def _run_client(command: list[str], server_pid: int, seconds: float) -> dict[str, Any]:
    """One closed-loop run; the server's, the client's and PostgreSQL's CPU per cycle beside it."""
    from bench import http_bench
    from bench.common import host_cpu, steal_share

    procs = http_bench._processes(server_pid)
    cpu0 = http_bench._cpu_seconds(procs)
    db0 = http_bench._database_cpu()
    host0 = host_cpu()
    started = time.perf_counter()
    client = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stdout, stderr = client.communicate(timeout=seconds + 60)
    # The client's own CPU: its rusage, read when it is reaped (communicate already did; the
    # children's totals of this process grow by exactly that child).
    elapsed = time.perf_counter() - started
    if client.returncode != 0:
        raise RuntimeError(f"{command[1]} failed: {stderr[-2000:]}")
    result: dict[str, Any] = http_bench.supplied(
        json.loads(stdout.strip().splitlines()[-1]), command[2]
    )
    cycles = max(1, result["cycles"])
    server_cpu = http_bench._cpu_seconds(procs) - cpu0
    db1 = http_bench._database_cpu()
    result["server_cpu_ms_per_cycle"] = round(1000 * server_cpu / cycles, 2)
    if db1:
        db_cpu = sum(t - db0.get(pid, 0.0) for pid, t in db1.items())
        result["db_cpu_ms_per_cycle"] = round(1000 * db_cpu / cycles, 2)
    result["elapsed_s"] = round(elapsed, 2)
    result["load_avg_1m"] = round(os.getloadavg()[0], 2)
    result["cpu_steal_share"] = steal_share(host0, host_cpu())
    return result


class _ChildCpu:
    """The CPU of the children this process reaped between two reads (the load client's)."""

    def __enter__(self) -> _ChildCpu:
        times = os.times()
        self._start = times.children_user + times.children_system
        return self

    def __exit__(self, *exc: object) -> None:
        times = os.times()
        self.seconds = times.children_user + times.children_system - self._start


def measure(anchor: Path, duration_s: float, repeats: int) -> dict[str, Any]:
    import psycopg

    from bench import http_bench
    from switchboard.liveserver import current_database_url, live_server

    venv = anchor_venv(anchor)
    dsn = current_database_url()
    name = dsn.split("@/", 1)[1].split("?", 1)[0] if "@/" in dsn else dsn.rsplit("/", 1)[1]
    anchor_db = f"{name}_anchor"
    admin = dsn.replace(f"/{name}", "/postgres", 1)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{anchor_db}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{anchor_db}"')
    anchor_dsn = dsn.replace(f"/{name}", f"/{anchor_db}", 1)
    per_run = http_bench.todos_for(duration_s)
    node = http_bench._node()
    clients = {"anchor_client": str(anchor / "client.mjs"), "bench_client": str(http_bench.CLIENT)}
    runs: dict[str, dict[str, dict[int, list[dict[str, Any]]]]] = {}

    def load_anchor(n: int) -> None:
        subprocess.run(
            [str(venv / "bin" / "python"), "load.py", str(n)],
            cwd=anchor,
            env={**os.environ, "DSN": anchor_dsn},
            check=True,
        )

    try:
        with (
            http_bench.bench_endpoint("bench yardstick") as (endpoint, token),
            _anchor_server(anchor, venv, anchor_dsn) as (anchor_base, anchor_pid),
            http_bench._baseline_server(dsn) as baseline,
            http_bench._baseline_server(dsn, http_bench.ANCHOR_STACK) as stack,
            live_server(workers=1) as base,
        ):
            servers = {
                "anchor": ("baseline", anchor_base, ANCHOR_TOKEN, anchor_pid, load_anchor),
                **http_bench.servers(
                    dsn, {"bench_baseline": baseline, "anchor_stack": stack}, base, endpoint, token
                ),
            }
            for server, (kind, url, secret, pid, load) in servers.items():  # warm-up
                load(per_run)
                _one(node, clients["bench_client"], kind, url, secret, 8, 1.0, pid, server)
            for _ in range(repeats):
                for n_clients in CLIENTS:
                    for client_name, script in clients.items():
                        for server, (kind, url, secret, pid, load) in servers.items():
                            load(per_run)
                            result = _one(
                                node, script, kind, url, secret, n_clients, duration_s, pid, server
                            )
                            by = runs.setdefault(client_name, {}).setdefault(server, {})
                            by.setdefault(n_clients, []).append(result)
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{anchor_db}" WITH (FORCE)')
    tables = {
        client: {
            server: {c: http_bench._median_run(r) for c, r in by.items()}
            for server, by in servers_.items()
        }
        for client, servers_ in runs.items()
    }
    return {
        "duration_s": duration_s,
        "repeats": repeats,
        "cpus": os.cpu_count(),
        "anchor": str(anchor),
        "anchor_venv": str(venv),
        "tables": tables,
        "ratios": {client: _ratios(table) for client, table in tables.items()},
    }


def _one(
    node: str,
    script: str,
    kind: str,
    url: str,
    token: str,
    clients: int,
    seconds: float,
    pid: int,
    server: str,
) -> dict[str, Any]:
    # The two clients name the bare claim/complete routes differently.
    if kind == "baseline" and script != str(_bench_client()):
        kind = "anchor"
    command = [node, script, kind, url, token, str(clients), f"{seconds:g}"]
    with _ChildCpu() as child:
        result = _run_client(command, pid, seconds)
    result["kind"] = server
    result["client_cpu_ms_per_cycle"] = round(1000 * child.seconds / max(1, result["cycles"]), 2)
    result["client_cpu_share"] = round(child.seconds / max(1e-9, result["elapsed_s"]), 3)
    return result


def _bench_client() -> Path:
    from bench import http_bench

    return http_bench.CLIENT


def _ratios(table: dict[str, dict[int, dict[str, Any]]]) -> dict[str, Any]:
    """REST's and MCP's figures against each yardstick, in issue 11's terms."""
    from bench import http_bench

    out: dict[str, Any] = {}
    for yard in ("anchor", "anchor_stack", "bench_baseline"):
        for kind in ("rest", "mcp"):
            cycles, p99, p50 = http_bench.ratios(
                table[kind][1], table[kind][8], table[yard][1], table[yard][8]
            )
            out[f"{kind}_vs_{yard}"] = {
                "cycles_ratio_at_8": round(cycles, 3),
                "p99_at_8_over_p50": round(p99, 2),
                "p50_at_1_over_p50": round(p50, 2),
            }
    return out


def summary(results: dict[str, Any]) -> str:
    lines = []
    for client, table in results["tables"].items():
        lines.append(f"client {client}")
        lines.append(
            "  server           clients  cycles/s  p50 ms  p99 ms  server ms/cyc  db ms/cyc  "
            "client ms/cyc  client CPU"
        )
        for server, by in table.items():
            for c, r in sorted(by.items()):
                lines.append(
                    f"  {server:<16} {c:>7}  {r['cycles_per_s']:>8}  {r['p50_ms']:>6}  "
                    f"{r['p99_ms']:>6}  {r['server_cpu_ms_per_cycle']:>13}  "
                    f"{r.get('db_cpu_ms_per_cycle', '-'):>9}  {r['client_cpu_ms_per_cycle']:>13}  "
                    f"{r['client_cpu_share']:>10}   runs {r['runs_cycles_per_s']}"
                )
        for name, ratio in results["ratios"][client].items():
            lines.append(f"  {name}: {ratio}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.yardstick")
    parser.add_argument("--anchor", type=Path, default=DEFAULT_ANCHOR, help="the anchor's folder")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--duration", type=float, default=5.0)
    args = parser.parse_args(argv)
    anchor = args.anchor.resolve()
    if not (anchor / "app.py").exists():
        print(f"no anchor at {anchor} (--anchor DIR)", file=sys.stderr)
        return 2

    from bench.__main__ import standalone

    def body() -> None:
        from bench.common import write_result

        results = measure(anchor, args.duration, args.repeats)
        path = write_result("yardstick", results)
        print(summary(results))
        print(f"results: {path}")

    return standalone(body)


if __name__ == "__main__":
    sys.exit(main())
