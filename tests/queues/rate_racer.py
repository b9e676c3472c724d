"""A child process for the leased-rate race (test_ratelimit.py): threads calling
``ratelimit.take`` on one bucket, first paced below the rate (the bucket stays full and the
process holds leases), then as fast as they can (the bucket runs dry).

Usage: python -m tests.queues.rate_racer KEY RATE BURST THREADS PACE (seconds between a thread's
calls while paced); prints "ready" once set up, then
reads one line "START PACED_UNTIL END" (``time.time()`` seconds) and prints one JSON line:
{"admitted": [times], "retry_after": [seconds of each refusal], "calls": [times of this
process's script calls to Redis]}.
Environment: REDIS_URL, DJANGO_SETTINGS_MODULE (and DATABASE_URL, not used).
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any


def main(key: str, rate: float, burst: int, threads: int, pace: float) -> None:
    import django

    django.setup()
    from switchboard.core import ratelimit

    # This process's own calls: Redis's command statistics count every client of the server
    # (the other test workers' scripts too).
    calls: list[float] = []
    call = ratelimit._call

    def counted(*args: Any, **kwargs: Any) -> tuple[int, int]:
        calls.append(time.time())
        return call(*args, **kwargs)

    ratelimit._call = counted
    print("ready", flush=True)
    start, paced, end = (float(x) for x in sys.stdin.readline().split())

    admitted: list[float] = []
    retry_after: list[int] = []
    lock = threading.Lock()

    def racer() -> None:
        mine: list[float] = []
        refusals: list[int] = []
        time.sleep(max(0.0, start - time.time()))
        while (now := time.time()) < end:
            allowed, wait = ratelimit.take(key, rate=rate, burst=burst)
            if allowed:
                mine.append(time.time())
            else:
                refusals.append(wait)
            if now < paced:
                time.sleep(pace)
        with lock:
            admitted.extend(mine)
            retry_after.extend(refusals)

    workers = [threading.Thread(target=racer) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    report = {"admitted": admitted, "retry_after": retry_after, "calls": calls}
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    key, rate, burst, threads, pace = sys.argv[1:6]
    main(key, float(rate), int(burst), int(threads), float(pace))
