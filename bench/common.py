"""Shared bench plumbing: timed worker pools (threads or processes), results as JSON."""

from __future__ import annotations

import contextlib
import importlib
import json
import multiprocessing
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from datetime import UTC, datetime
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any, cast

RESULTS = Path(__file__).resolve().parent / "results"


# A workload is named "module:function", the function a context manager taking (worker index,
# *args) that opens what one worker needs (its connections) and yields one claim cycle: a callable
# returning False when there is no more work. By name, so a spawned process can import it.
Workload = Callable[..., AbstractContextManager[Callable[[], bool]]]
MODES = ("threads", "processes")


def _workload(name: str) -> Workload:
    module, _, attr = name.partition(":")
    return cast(Workload, getattr(importlib.import_module(module), attr))


# /proc/stat's first line: the machine's CPU time since boot in clock ticks, per state. Steal is
# the time this virtual machine's CPUs were ready to run but the hypervisor did not run them. On
# a shared host it moves every rate a bench reports, whatever the code does (issue 12: 9-12 % of
# the CPU time on 2026-12-02's machine, and cycles/s of one loop swinging 1.9x between runs). It
# is not only another guest's CPU use: a virtual CPU that wakes (a round trip's answer, a flush's
# end) may wait for the host to run it, and that wait is steal too. On 2026-12-03's machine a
# loop of fdatasync calls drew up to 45 % steal, one-byte round trips between two processes up
# to 28 %, two busy processes 1-3 % (``host_probe``); in quieter minutes the loops drew 0-2 %.
_CPU_STATES = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def host_cpu(path: str = "/proc/stat") -> tuple[int, ...]:
    """The machine's CPU ticks so far per state (``_CPU_STATES``), or () where it cannot be read
    (no /proc: not Linux)."""
    try:
        with open(path) as f:
            first = f.readline().split()
    except OSError:
        return ()
    if not first or first[0] != "cpu" or len(first) < 1 + len(_CPU_STATES):
        return ()
    return tuple(int(x) for x in first[1 : 1 + len(_CPU_STATES)])


def steal_share(before: tuple[int, ...], after: tuple[int, ...]) -> float | None:
    """The share of the machine's CPU time between two ``host_cpu`` readings that was stolen by
    the hypervisor, 0-1; None when either reading is missing or no tick passed."""
    spent = _spent(before, after)
    if spent is None or (total := sum(spent)) <= 0:
        return None
    return round(spent[_STEAL] / total, 4)


_STEAL = _CPU_STATES.index("steal")
# The states in which a CPU did this machine's work: not idle, not waiting on disk with nothing
# else to run, not stolen.
_BUSY = tuple(_CPU_STATES.index(s) for s in ("user", "nice", "system", "irq", "softirq"))
_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01


def host_busy(
    before: tuple[int, ...], after: tuple[int, ...], cycles: int
) -> tuple[float, float] | tuple[None, None]:
    """Between two ``host_cpu`` readings: the share of the machine's CPU time that was busy
    (0-1), and the busy CPU time per cycle in microseconds (every process on the machine: the
    workers, PostgreSQL's backends and its WAL writer, anything else running). (None, None)
    when either reading is missing, no tick passed or no cycle ran.

    A loop whose machine is busy all the time is bound by CPU per cycle, and its rate against
    another loop's is the inverse ratio of their CPU per cycle; a loop with idle CPU waits for
    something else too (a flush to disk, a lock, a wake-up), and those waits weigh on both loops
    alike (issue 12: the core bench in processes ran with the machine ~75 % busy)."""
    spent = _spent(before, after)
    if spent is None or (total := sum(spent)) <= 0 or cycles <= 0:
        return None, None
    busy = sum(spent[i] for i in _BUSY)
    return round(busy / total, 4), round(busy * _TICK_S * 1e6 / cycles, 1)


def _spent(before: tuple[int, ...], after: tuple[int, ...]) -> list[int] | None:
    """The ticks per state between two ``host_cpu`` readings; None when either is missing."""
    if not before or not after:
        return None
    return [b - a for a, b in zip(before, after, strict=True)]


FLUSH_PAGE = 8192  # one WAL page: what a small commit writes and flushes
# The other end of ``host_probe``'s round trips: a byte back for each byte, until end of input.
_ECHO = "import os\nwhile (b := os.read(0, 1)):\n    os.write(1, b)\n"


def host_probe(folder: Path, seconds: float = 1.0) -> dict[str, Any]:
    """What the host gives a bench at this moment, ``seconds`` per part:

    - ``flush``: one 8 KiB page rewritten and ``fdatasync``ed in a loop, in a file of its own in
      ``folder`` (the embedded server's data folder: every commit waits for a flush of its WAL),
      removed after. A loop of commits (the raw loops at one worker) is bound by it.
    - ``wake``: one-byte round trips through pipes with another process, as a client and its
      database server take turns: two wake-ups each, nothing else.

    Each with its rate, its µs per flush or round trip, and the steal share over its loop with
    the stolen µs per flush or round trip. On a virtual machine a virtual CPU that wakes may
    wait for the host to run it, and that wait is steal: a loop of round trips pays it on every
    one, a CPU-bound loop hardly (2026-12-03: 53 µs stolen per round trip, 28 % of the CPU time,
    against 1-3 % for two busy processes)."""
    folder.mkdir(parents=True, exist_ok=True)
    page = os.urandom(FLUSH_PAGE)
    fd, name = tempfile.mkstemp(prefix="flush-probe-", dir=folder)

    def flush_once() -> None:
        os.pwrite(fd, page, 0)
        os.fdatasync(fd)

    try:
        flush = _timed_loop(seconds, flush_once)
    finally:
        os.close(fd)
        os.unlink(name)
    echo = subprocess.Popen(
        [sys.executable, "-c", _ECHO], stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0
    )
    assert echo.stdin is not None and echo.stdout is not None
    to, back = echo.stdin.fileno(), echo.stdout.fileno()

    def round_trip() -> None:
        os.write(to, b"x")
        os.read(back, 1)

    try:
        round_trip()  # the other side is up once it answers
        wake = _timed_loop(seconds, round_trip)
    finally:
        echo.stdin.close()
        echo.wait(timeout=10)
        echo.stdout.close()
    return {"flush": flush, "wake": wake}


# ``python -m bench --wait-quiet S``: a bench starts once this many probes in a row (``host_probe``) saw
# the hypervisor take less than this share of the CPU time, or when the wait runs out.
QUIET_STEAL = 0.05
QUIET_PROBES = 2


def probe_steal(probe: dict[str, Any]) -> float | None:
    """A ``host_probe``'s worst steal share over its parts; None when the host gives none."""
    shares = [part["cpu_steal_share"] for part in probe.values()]
    known = [share for share in shares if share is not None]
    return max(known) if known else None


def wait_for_quiet(
    folder: Path,
    max_wait_s: float,
    *,
    max_steal: float = QUIET_STEAL,
    needed: int = QUIET_PROBES,
    pause_s: float = 20.0,
    probe: Callable[[Path], dict[str, Any]] = host_probe,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> dict[str, Any]:
    """Probe the host until ``needed`` probes in a row saw a steal share under ``max_steal``,
    ``pause_s`` between a noisy probe and the next; give up once the next wait would pass
    ``max_wait_s``. On a shared host the steal comes and goes within minutes, and a run that
    started in a noisy spell measures the host (README, Benchmarks). The record says what was
    seen: ``quiet`` True (the bench starts in a quiet spell), False (the wait ran out: the bench
    runs anyway, and its result says so), or None (this host reports no steal to judge by)."""
    started = clock()
    seen: list[float | None] = []
    in_a_row = 0
    quiet: bool | None = False
    while True:
        steal = probe_steal(probe(folder))
        seen.append(None if steal is None else round(steal, 3))
        if steal is None:
            quiet = None
            break
        if steal < max_steal:
            in_a_row += 1
            if in_a_row >= needed:
                quiet = True
                break
            continue
        in_a_row = 0
        if clock() - started + pause_s > max_wait_s:
            break
        sleep(pause_s)
    return {
        "quiet": quiet,
        "max_steal": max_steal,
        "needed": needed,
        "probes": seen,
        "waited_s": round(clock() - started, 1),
    }


def _timed_loop(seconds: float, step: Callable[[], None]) -> dict[str, Any]:
    """``step`` repeated for ``seconds`` (at least once): per second, µs each, the steal."""
    before = host_cpu()
    started = time.perf_counter()
    done = 0
    while (elapsed := time.perf_counter() - started) < seconds or done == 0:
        step()
        done += 1
    after = host_cpu()
    spent = _spent(before, after)
    stolen_us = None
    if spent is not None:
        stolen_us = round(spent[_STEAL] / os.sysconf("SC_CLK_TCK") * 1e6 / done, 1)
    return {
        "per_s": round(done / elapsed, 1),
        "us_each": round(elapsed / done * 1e6, 1),
        "cpu_steal_share": steal_share(before, after),
        "stolen_us_each": stolen_us,
    }


def _summarise(
    workers: int,
    latencies: list[float],
    elapsed: float,
    dry: bool,
    cpu_before: tuple[int, ...] = (),
) -> dict[str, Any]:
    after = host_cpu()
    flat = sorted(latencies)
    busy_share, busy_us = host_busy(cpu_before, after, len(flat))
    return {
        "workers": workers,
        "cycles": len(flat),
        "seconds": round(elapsed, 3),
        "cycles_per_s": round(len(flat) / elapsed, 1),
        "p50_ms": round(_pct(flat, 50) * 1000, 3) if flat else None,
        "p99_ms": round(_pct(flat, 99) * 1000, 3) if flat else None,
        "mean_ms": round(statistics.fmean(flat) * 1000, 3) if flat else None,
        "ran_dry": dry,
        "load": [round(x, 2) for x in os.getloadavg()],
        "cpu_steal_share": steal_share(cpu_before, after),
        "host_busy_share": busy_share,
        "host_cpu_us_per_cycle": busy_us,
    }


@contextmanager
def claim_loop(i: int, endpoint_id: Any) -> Iterator[Callable[[], bool]]:
    """The agent's cycle every claim bench measures: claim_next on the endpoint, then complete."""
    from queues import services
    from queues.access import AgentActor
    from queues.models import Endpoint

    actor = AgentActor(Endpoint.objects.get(pk=endpoint_id), via="api")  # connects before the clock

    def cycle() -> bool:
        claimed = services.claim_next(actor=actor, claimant=f"bench-{i}")
        if not isinstance(claimed, services.Claimed):
            return False
        services.complete(actor=actor, todo_id=claimed.todo.id)
        return True

    yield cycle


def timed_pool(
    workers: int,
    duration_s: float,
    workload: str,
    *args: Any,
    clock: Callable[[bool], None] | None = None,
) -> dict[str, Any]:
    """Run ``workload`` in ``workers`` threads for ``duration_s`` (each with its own connections,
    opened before the clock starts). Returns cycles/s and latency percentiles (ms). ``clock``,
    if given, is called with True just before the clock starts and False once every thread has
    stopped, so a caller can read its own counters over exactly the timed window."""
    from django.db import connections

    latencies: list[list[float]] = [[] for _ in range(workers)]
    stop = threading.Event()
    dry = threading.Event()
    barrier = threading.Barrier(workers + 1)
    errors: list[BaseException] = []
    factory = _workload(workload)

    def body(i: int) -> None:
        try:
            with factory(i, *args) as cycle:
                barrier.wait()
                if _loop(cycle, stop.is_set, latencies[i]):
                    dry.set()
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()
        finally:
            connections.close_all()

    threads = [threading.Thread(target=body, args=(i,), daemon=True) for i in range(workers)]
    for t in threads:
        t.start()
    try:
        barrier.wait()
    except threading.BrokenBarrierError:
        pass
    if clock is not None:
        clock(True)
    cpu_before = host_cpu()
    started = time.perf_counter()
    if not errors:
        time.sleep(duration_s)
    stop.set()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - started
    if clock is not None:
        clock(False)
    if errors:
        raise errors[0]
    return _summarise(
        workers, [x for lat in latencies for x in lat], elapsed, dry.is_set(), cpu_before
    )


def _loop(cycle: Callable[[], bool], stopped: Callable[[], bool], latencies: list[float]) -> bool:
    """Cycle until ``stopped``, timing each cycle; True if the work ran dry first."""
    while not stopped():
        t0 = time.perf_counter()
        if not cycle():
            return True
        latencies.append(time.perf_counter() - t0)
    return False


class ProcessPool:
    """``size`` spawned worker processes, each with its own Django setup, started once for a
    bench (a Django process takes a second or more to start on a loaded machine) and kept for
    all its points. ``run`` hands a workload to the first ``workers`` of them: each opens its own
    connections, says it is ready, and only then does the clock start; each counts cycles until
    the shared stop event, so every process measures the same window.

    Threads share one interpreter lock, so the Python of every claim (Django, the ORM, psycopg's
    adaptation) runs one thread at a time; processes are how workers run in production (gunicorn,
    Celery's prefork pool), so the bench reports both."""

    def __init__(self, size: int) -> None:
        ctx = multiprocessing.get_context("spawn")
        # A worker uses one connection: a pool of two per process (the default minimum) would
        # open twice the server's share at 32 processes and run it out of connections.
        os.environ["DATABASE_POOL_MIN"] = "1"
        self.go = ctx.Event()
        self.stop = ctx.Event()
        self.pipes: list[Connection] = []
        self.procs: list[BaseProcess] = []
        for i in range(size):
            ours, theirs = ctx.Pipe()
            proc = ctx.Process(
                target=_child, args=(i, theirs, self.go, self.stop), daemon=True, name=f"bench-{i}"
            )
            proc.start()
            self.pipes.append(ours)
            self.procs.append(proc)
        for pipe in self.pipes:
            _expect(pipe, "up")

    def __enter__(self) -> ProcessPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for pipe in self.pipes:
            try:
                pipe.send(None)
            except OSError:
                pass
        for proc in self.procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
        self.pipes, self.procs = [], []

    def run(self, workers: int, duration_s: float, workload: str, *args: Any) -> dict[str, Any]:
        """As ``timed_pool``, in ``workers`` of the pool's processes."""
        if workers > len(self.pipes):
            raise ValueError(f"workers: {workers} asked of a pool of {len(self.pipes)} processes")
        pipes = self.pipes[:workers]
        self.go.clear()
        self.stop.clear()
        for pipe in pipes:
            pipe.send((workload, args))
        errors = [reply[1] for reply in (pipe.recv() for pipe in pipes) if reply[0] == "error"]
        cpu_before = host_cpu()
        started = time.perf_counter()
        self.go.set()
        if not errors:
            time.sleep(duration_s)
        self.stop.set()
        latencies: list[float] = []
        dry = False
        for pipe in pipes:
            reply = pipe.recv()
            if reply[0] == "error":
                errors.append(reply[1])
            elif reply[0] == "done":
                latencies.extend(reply[1])
                dry = dry or reply[2]
        elapsed = time.perf_counter() - started
        if errors:
            raise RuntimeError(f"a bench worker process failed:\n{errors[0]}")
        return _summarise(workers, latencies, elapsed, dry, cpu_before)


def _expect(pipe: Connection, word: str) -> None:
    reply = pipe.recv()
    if reply != word:
        raise RuntimeError(f"a bench worker process failed to start:\n{reply}")


def _child(index: int, pipe: Connection, go: Any, stop: Any) -> None:
    """One worker process: set Django up once, then run workloads as the parent hands them over.
    Replies: "ready" (or "error") once its connections are open, then "done" with its latencies
    (or "error"), never both errors for one workload."""
    try:
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "switchboard.settings")
        import django

        django.setup()
    except BaseException:
        pipe.send(traceback.format_exc())
        return
    pipe.send("up")
    from django.db import connections

    while (message := pipe.recv()) is not None:
        name, args = message
        ready = False
        try:
            with _workload(name)(index, *args) as cycle:
                pipe.send(("ready", None))
                ready = True
                go.wait()
                latencies: list[float] = []
                dry = _loop(cycle, stop.is_set, latencies)
            pipe.send(("done", latencies, dry))
        except BaseException:
            # Before "ready" the parent awaits a ready; after it, a done: one reply for each.
            pipe.send(("error", traceback.format_exc()))
            if not ready:
                go.wait()
                stop.wait()
                pipe.send(("skipped", None))
        finally:
            connections.close_all()


def summary(values: list[float]) -> dict[str, Any]:
    """Median, spread and every run of one point measured several times."""
    return {
        "median": round(statistics.median(values), 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
        "runs": [round(v, 3) for v in values],
    }


def _pct(values: list[float], p: float) -> float:
    if not values:
        return 0.0
    k = min(len(values) - 1, max(0, round(p / 100 * (len(values) - 1))))
    return values[k]


def write_result(name: str, data: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    data = {
        "bench": name,
        "at": stamp,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        **data,
    }
    path = RESULTS / f"{name}-{stamp}.json"
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")
    (RESULTS / f"{name}-latest.json").write_text(json.dumps(data, indent=2, default=str) + "\n")
    return path


class StreamReader:
    """A streamed GET (server-sent events) read line by line on a thread, each line handed to
    ``on_line``. ``close()`` hangs up from the client's side, before the bench stops its server:
    it shuts the socket down (a read blocked in recv() returns), joins the thread, and raises an
    error the stream met before the hang-up; what the hang-up itself causes is its end, not an
    error. Stopping the server under a reader instead left it to die with a printed
    RemoteProtocolError traceback ("peer closed connection without sending complete message
    body"), which hid nothing but looked like a failure."""

    def __init__(self, url: str, on_line: Callable[[str], None], **kw: Any) -> None:
        self._hung_up = threading.Event()
        self._opened = threading.Event()
        self._response: Any = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._read, args=(url, on_line, kw), daemon=True)
        self._thread.start()

    def _read(self, url: str, on_line: Callable[[str], None], kw: dict[str, Any]) -> None:
        import httpx

        try:
            with httpx.stream("GET", url, **kw) as response:
                self._response = response
                self._opened.set()
                response.raise_for_status()
                for line in response.iter_lines():
                    on_line(line)
        except Exception as exc:
            if not self._hung_up.is_set():
                self.error = exc
        finally:
            self._opened.set()

    def close(self) -> None:
        import socket

        self._hung_up.set()
        self._opened.wait(30)
        if self._response is not None:
            stream = self._response.extensions.get("network_stream")
            sock = stream.get_extra_info("socket") if stream is not None else None
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
        self._thread.join(30)
        if self.error is not None:
            raise RuntimeError(f"the stream {self._response!r} failed") from self.error


# Finished todos, each with its ended attempt, on an endpoint of their own, loaded once before
# the benches: a production table has a history, and an emptied one makes the planner cache
# plans a live system never runs (the completion's read of queues_attempt as a sequential
# scan and hash join, on every completion of the run: found by issue 12's b12 helper).
HISTORY_TODOS = 20_000


def load_history(n: int = HISTORY_TODOS) -> None:
    """``n`` done todos with their completed attempts, then both tables vacuumed and analysed."""
    from django.contrib.auth import get_user_model
    from django.db import connection

    from queues import services
    from queues.access import SystemActor

    owner, _ = get_user_model().objects.get_or_create(username="bench-history")
    endpoint, _token = services.endpoint_vend(
        actor=SystemActor(via="bench"), owner=owner, name="bench history", queues=["history"], rps=0
    )
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO queues_todo (id, endpoint_id, queue, title, kind, payload, state, owner,
                attempt, max_attempts, source, created_at, updated_at, claimed_at, finished_at)
            SELECT gen_random_uuid(), %s, 'history', 'history ' || g, '', '{}'::jsonb, 'done',
                   'history', 1, 5, 'api', now() - make_interval(secs => g), now(), now(), now()
            FROM generate_series(1, %s) g
            """,
            [endpoint.id, n],
        )
        cursor.execute(
            """
            INSERT INTO queues_attempt (todo_id, number, endpoint_id, claimant, via, claimed_at,
                lease_expires_at, ended_at, outcome, disposition, summary)
            SELECT t.id, 1, t.endpoint_id, 'history', 'api', t.created_at,
                   t.created_at + interval '5 minutes', t.created_at + interval '1 second',
                   'completed', 'done', ''
            FROM queues_todo t WHERE t.endpoint_id = %s
            """,
            [endpoint.id],
        )
        cursor.execute("VACUUM ANALYZE queues_todo")
        cursor.execute("VACUUM ANALYZE queues_attempt")
