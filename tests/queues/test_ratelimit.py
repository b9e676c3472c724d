"""The endpoint rate limit's leases (issue 11): a busy process takes a few tokens from the shared
bucket in one call, and the bucket is never more permissive for it. Real Valkey; the race runs
real processes (tests/queues/rate_racer.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from switchboard.core import counters, ratelimit
from tests.conftest import Personas, database_url

ROOT = Path(__file__).resolve().parents[2]


def _bucket(key: str) -> dict[str, float]:
    raw = counters.client().hgetall(f"switchboard:bucket:{key}")
    return {k.decode(): float(v) for k, v in raw.items()}  # type: ignore[union-attr]


@pytest.fixture
def script_calls(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The times of this process's script calls to Redis (``_call``, the limiter's only way to
    it). Not Redis's command statistics: those count every client of the server, the other test
    workers' scripts too (171 "calls" for 139 admissions in one CI run)."""
    calls: list[float] = []
    call = ratelimit._call

    def counted(*args: Any, **kwargs: Any) -> tuple[int, int]:
        calls.append(time.time())
        return call(*args, **kwargs)

    monkeypatch.setattr(ratelimit, "_call", counted)
    return calls


def test_no_lease_at_the_default_and_low_rates(script_calls: list[float]) -> None:
    assert ratelimit.lease_size(20, 40) == 1
    assert ratelimit.lease_size(0.1, 6) == 1
    assert ratelimit.lease_size(1, 10) == 1
    assert ratelimit.lease_size(100, 200) == 2  # a lease is at most 1 % of the burst
    assert ratelimit.lease_size(100000, 200000) == ratelimit.LEASE_MAX
    answers = [ratelimit.take("low", rate=20, burst=40)[0] for _ in range(30)]
    assert answers == [True] * 30
    assert len(script_calls) == 30  # one call to Redis per request, as before leases


def test_a_busy_process_calls_redis_once_per_lease_not_once_per_request(
    script_calls: list[float],
) -> None:
    answers = [ratelimit.take("busy", rate=100000, burst=200000)[0] for _ in range(2000)]
    calls = len(script_calls)
    assert answers == [True] * 2000
    assert calls <= 2000 / (ratelimit.LEASE_MAX / 2), calls


def test_a_bucket_less_than_half_full_grants_one_token_at_a_time() -> None:
    key, holder, now = "near-empty", "h", 1000.0  # one instant: no refill
    grants: list[int] = []
    while not grants or grants[-1] == 32:
        grants.append(ratelimit._call(key, 1000, 2000, now, 32, holder)[0])
    # Leases while the bucket stays at least half full after them (2000 - 31 × 32 = 1008).
    assert grants == [32] * 31 + [1]
    assert _bucket(key)["tokens"] == 1007
    for _ in range(1007):
        assert ratelimit._call(key, 1000, 2000, now, 32, holder) == (1, 0)
    # Empty: refused, and told to wait for one token's refill (1 ms at 1000/s), as without leases.
    assert ratelimit._call(key, 1000, 2000, now, 32, holder) == (0, 1)
    assert ratelimit._call(key, 1000, 2000, now + 0.0015, 1, holder) == (1, 0)


def test_the_bucket_refills_only_to_the_burst_less_the_leases_others_hold() -> None:
    key, lease = "held", ratelimit.LEASE_SECONDS
    assert ratelimit._call(key, 1000, 2000, 100.0, 32, "a") == (32, 0)
    assert _bucket(key)["tokens"] == 1968
    # 0.1 s later the refill would fill the bucket; "a" may still hold 32, so it stops at 1968.
    assert ratelimit._call(key, 1000, 2000, 100.1, 1, "b") == (1, 0)
    assert _bucket(key)["tokens"] == 1967
    # "a" asking again has dropped what it held: its own lease no longer counts.
    assert ratelimit._call(key, 1000, 2000, 100.15, 32, "a") == (32, 0)
    assert _bucket(key)["tokens"] == 2000 - 32
    # Once "a"'s lease has expired the bucket fills to the burst again.
    assert ratelimit._call(key, 1000, 2000, 100.15 + lease + 0.01, 1, "b") == (1, 0)
    assert _bucket(key)["tokens"] == 1999


def _most_admitted_beyond_the_refill(times: list[float], rate: float) -> float:
    """max over windows [t_i, t_j] of (admissions in it) - rate × (t_j - t_i): what today's
    bucket bounds by its burst."""
    times = sorted(times)
    worst, best_start = 0.0, float("-inf")
    for j, t in enumerate(times):
        best_start = max(best_start, rate * times[j] - j)
        worst = max(worst, j + 1 + best_start - rate * t)
    return worst


def test_leased_processes_racing_never_exceed_the_bucket_s_bound() -> None:
    """Three processes of two threads each: half a second below the rate (the bucket stays full,
    every process holds a lease), then 1.5 s as fast as they can (the bucket runs dry, the
    processes race near empty). Over every window the admissions stay within burst + rate × t;
    a bucket that refilled to the burst under the leases others hold would admit their unspent
    tokens on top (~3 × 12 here)."""
    rate, burst, threads, pace = 500.0, 2000, 2, 0.02  # leases of 20; paced, 300 calls/s
    assert ratelimit.lease_size(rate, burst) == 20
    key = f"race-{uuid.uuid4().hex[:8]}"
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "REDIS_URL": settings.REDIS_URL,
        "DJANGO_SETTINGS_MODULE": "switchboard.settings",
    }
    args = [key, str(rate), str(burst), str(threads), str(pace)]
    command = [sys.executable, "-m", "tests.queues.rate_racer", *args]
    pipe = subprocess.PIPE
    procs = [
        subprocess.Popen(command, cwd=ROOT, env=env, stdin=pipe, stdout=pipe, text=True)
        for _ in range(3)
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        start = time.time() + 0.2
        paced = start + 0.5
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write(f"{start} {paced} {paced + 1.5}\n")
            proc.stdin.flush()
        reports = [json.loads(proc.communicate(timeout=60)[0]) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    admitted = [t for r in reports for t in r["admitted"]]
    refusals = [s for r in reports for s in r["retry_after"]]
    paced_admitted = sum(1 for t in admitted if t < paced)
    paced_calls = sum(1 for r in reports for t in r["calls"] if t < paced)
    worst = _most_admitted_beyond_the_refill(admitted, rate)
    assert refusals and all(s >= 1 for s in refusals)  # the race did reach the limit
    assert paced_calls < paced_admitted / 3  # and leases were in play
    # Slack: one token per thread may be between Redis's grant and the thread's clock.
    assert worst <= burst + 3 * threads, (worst, len(admitted))


def test_any_positive_rate_limits_however_slow_it_refills() -> None:
    # 1e-300 per second takes 1e303 ms to refill a token: past any expiry Redis takes, so the
    # script failed and the limiter admitted everything (and opened the breaker for everyone).
    longest_s = ratelimit.LONGEST_MS // 1000
    for rate in (1e-300, 5e-324, 1e-12):
        key = f"slow-{rate}"
        assert ratelimit.take(key, rate=rate, burst=1) == (True, 0)
        assert ratelimit.take(key, rate=rate, burst=1) == (False, longest_s), rate
        ttl_ms = counters.client().pttl(f"switchboard:bucket:{key}")
        assert 0 < ttl_ms <= ratelimit.LONGEST_MS
    # A burst large enough for leases: the burst, then nothing.
    answers = [ratelimit.take("slow-leased", rate=1e-300, burst=400)[0] for _ in range(410)]
    assert answers == [True] * 400 + [False] * 10
    assert ratelimit.availability.redis_breaker.allow()


def test_a_script_error_on_one_bucket_leaves_the_others_limited() -> None:
    # An error Redis answers (here: the bucket's key holds a string) admits that request, and
    # does not open the breaker, which would switch every endpoint's limit off for a while.
    counters.client().set("switchboard:bucket:broken", "not a hash")
    assert ratelimit.take("broken", rate=1, burst=1) == (True, 0)
    assert ratelimit.availability.redis_breaker.allow()
    assert ratelimit.take("sound", rate=1, burst=1) == (True, 0)
    assert ratelimit.take("sound", rate=1, burst=1) == (False, 1)


def test_racing_takes_from_a_bucket_that_never_refills_admit_exactly_its_burst() -> None:
    # The slow rates' guarantee under races (threads, each on its own pooled connection): a
    # burst of 1 admits one of sixteen, a leased burst of 400 exactly 400 of 640.
    def race(key: str, burst: int, takers: int, each: int) -> int:
        admitted: list[int] = []
        lock = threading.Lock()

        def take() -> None:
            n = sum(ratelimit.take(key, rate=1e-300, burst=burst)[0] for _ in range(each))
            with lock:
                admitted.append(n)

        threads = [threading.Thread(target=take) for _ in range(takers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return sum(admitted)

    assert race("slow-race", 1, 16, 1) == 1
    assert race("slow-race-leased", 400, 16, 40) == 400
    assert ratelimit.availability.redis_breaker.allow()


def test_racing_requests_of_an_endpoint_with_a_burst_alone_admit_exactly_that_burst(
    personas: Personas, settings: Any
) -> None:
    """An endpoint vended with --burst and no --rps of its own is held to that burst at the
    fleet's rate (it was stored, shown and ignored): sixteen threads at once, three admitted."""
    from queues import services
    from queues.auth import check_endpoint_rate
    from switchboard.core.errors import RateLimited
    from tests.conftest import FIXTURE

    settings.ENDPOINT_RATE_LIMIT = (1e-6, 40)  # the fleet's: nothing refills during the race
    endpoint, _ = services.endpoint_vend(
        actor=FIXTURE, owner=personas.owner, name="Burst alone", queues=["inbox"], burst=3
    )
    admitted: list[bool] = []
    lock = threading.Lock()

    def request() -> None:
        try:
            check_endpoint_rate(endpoint)
            ok = True
        except RateLimited:
            ok = False
        with lock:
            admitted.append(ok)

    threads = [threading.Thread(target=request) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert (admitted.count(True), admitted.count(False)) == (3, 13)
