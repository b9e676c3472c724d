"""Token buckets in Redis, shared by every process: per endpoint requests, per human policy writes.

One Lua script refills and takes atomically (sent once, then called by its SHA: ``EVALSHA``). If
Redis cannot be reached the limiter fails open (logged): a rate limit protects the service, it is
not a correctness guarantee. A failure opens the Redis breaker
(``switchboard.core.availability``), so a stall costs one request its timeout.

Leases (issue 11: the round trip cost the web thread ~90 µs of CPU on every agent request). At
a high rate a busy process takes a small lease of tokens from the shared bucket in one call and
spends them locally; what it has not spent after ``LEASE_SECONDS`` it drops (never given back as
extra). The bucket stays one bucket and is never more permissive than without leases:

* a lease is granted only while the bucket stays at least half full after it; below that every
  call takes one token, exactly as without leases, so behaviour near the limit (and a refusal's
  ``Retry-After``) is unchanged;
* Redis remembers each process's lease until it expires and refills the bucket only up to the
  burst less what other processes may still hold, so the tokens in the bucket plus every
  process's unspent lease never exceed the burst, and the requests admitted over any interval
  never exceed burst + rate × interval;
* no lease at all when one would be a noticeable share of the burst (``lease_size``): the
  default 20/40 and every low rate run exactly as before.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import threading
import time
import uuid

import redis
from redis.exceptions import NoScriptError

from switchboard.core import availability, counters

log = logging.getLogger(__name__)

# The largest lease, and the share of the burst a lease may be at most (1 %: a lease of two needs
# a burst of 200). A lease is spent locally for at most LEASE_SECONDS, then dropped. Measured
# 2026-12-02 (3,000 takes, thread CPU, interleaved, a loaded machine): one EVAL per take ~119 µs;
# leases of 8 ~25 µs, 16 ~13, 32 ~8, 64 ~6. Past 32 a request saves ≤ 2 µs more while a lease
# keeps twice as many tokens from the other processes. A quarter second: a process serving 128
# requests a second spends a whole lease within it; longer would keep unspent tokens from the
# others longer, shorter would send a moderately busy process to Redis more often.
LEASE_MAX = 32
LEASE_SHARE = 0.01
LEASE_SECONDS = 0.25

# The longest a bucket is kept, and so the longest wait it answers: ten years. A rate may be
# any positive number (1e-300 per second: a burst, then nothing), but the time to refill at it
# can be past any expiry Redis takes (Lua hands it ``1e+303``, not an integer: the script
# failed, and the limiter failed open). A bucket idle this long is full again when it expires.
LONGEST_MS = 10 * 365 * 86400 * 1000

# KEYS[1] bucket, KEYS[2] the leases outstanding (holder -> "tokens expires"); ARGV: rate per
# second, burst, now (seconds, float), and for a lease: tokens wanted, holder (without them, one
# token, the caller's leases untouched: every argument costs the caller's CPU to send).
# Returns {granted, wait_ms}: granted 0 = refused.
_TAKE = """
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local now = tonumber(ARGV[3])
local want = tonumber(ARGV[4]) or 1
local holder = ARGV[5]
local lease_s = LEASE_SECONDS
local state = redis.call('HMGET', KEYS[1], 'tokens', 'at', 'held_until')
local tokens = tonumber(state[1])
local at = tonumber(state[2])
local held_until = tonumber(state[3]) or 0
if tokens == nil then tokens = burst; at = now end
local held = 0
if held_until > now then
  local leases = redis.call('HGETALL', KEYS[2])
  for i = 1, #leases, 2 do
    local n, expires = string.match(leases[i + 1], '^(%S+) (%S+)$')
    expires = tonumber(expires)
    if leases[i] == holder or expires <= now then
      redis.call('HDEL', KEYS[2], leases[i])
    else
      held = held + tonumber(n)
    end
  end
elseif held_until > 0 then
  held_until = 0
  redis.call('DEL', KEYS[2])
end
tokens = math.min(burst - held, tokens + (now - at) * rate)
local granted = 0
local wait_ms = 0
if want > 1 and tokens - want >= burst / 2 then
  granted = want
  -- a millisecond late: the holder stops spending at now + lease_s by its own clock
  redis.call('HSET', KEYS[2], holder, want .. ' ' .. (now + lease_s + 0.001))
  redis.call('PEXPIRE', KEYS[2], math.ceil(lease_s * 1000) + 1000)
  held_until = math.max(held_until, now + lease_s + 0.001)
elseif tokens >= 1 then
  granted = 1
else
  wait_ms = math.min(math.ceil((1 - tokens) / rate * 1000), LONGEST_MS)
end
tokens = tokens - granted
redis.call('HSET', KEYS[1], 'tokens', tokens, 'at', now, 'held_until', held_until)
redis.call('PEXPIRE', KEYS[1], math.min(math.ceil(burst / rate * 1000) + 1000, LONGEST_MS))
return {granted, wait_ms}
""".replace("LEASE_SECONDS", repr(LEASE_SECONDS)).replace("LONGEST_MS", str(LONGEST_MS))
_SHA = hashlib.sha1(_TAKE.encode()).hexdigest()
_BUCKET = "switchboard:bucket:"


def lease_size(rate: float, burst: int) -> int:
    """Tokens a busy process may lease at once for this bucket; 1 = no leases."""
    if rate <= 0:
        return 1
    return max(1, min(LEASE_MAX, int(max(1, burst) * LEASE_SHARE)))


class _Lease:
    """This process's unspent tokens of one bucket, and how fast it has been spending them."""

    __slots__ = ("expires", "fetched_at", "refill", "spent", "tokens")

    def __init__(self) -> None:
        self.tokens = 0
        self.expires = 0.0
        self.fetched_at = -math.inf
        self.spent = 0  # tokens taken since the last call to Redis
        self.refill = threading.Lock()  # one call to Redis per bucket at a time in this process


_lock = threading.Lock()
_leases: dict[str, _Lease] = {}
_holder = uuid.uuid4().hex[:16]  # this process, in the bucket's record of its leases


def _after_fork_in_child() -> None:
    # A forked worker must not spend its parent's lease, nor hold leases under its name.
    global _holder, _lock
    _leases.clear()
    _lock = threading.Lock()
    _holder = uuid.uuid4().hex[:16]


os.register_at_fork(after_in_child=_after_fork_in_child)


def _call(
    key: str, rate: float, burst: int, now: float, want: int = 1, holder: str | None = None
) -> tuple[int, int]:
    """One call of the script by its SHA (loaded once per Redis server): (tokens granted,
    milliseconds to wait when none). redis-py's ``register_script`` does the same with more
    Python per call."""
    client = counters.client()
    bucket = _BUCKET + key
    args: tuple[str | float, ...] = (bucket, bucket + ":leases", rate, max(1, burst), now)
    if holder is not None:
        args += (want, holder)
    try:
        granted, wait_ms = client.evalsha(_SHA, 2, *args)
    except NoScriptError:
        client.script_load(_TAKE)
        granted, wait_ms = client.evalsha(_SHA, 2, *args)
    return int(granted), int(wait_ms)


def _spend(lease: _Lease, now: float) -> bool:
    with _lock:
        if lease.tokens > 0 and now < lease.expires:
            lease.tokens -= 1
            lease.spent += 1
            return True
        return False


def _refused(wait_ms: int) -> tuple[bool, int]:
    return False, max(1, math.ceil(wait_ms / 1000))


def take(key: str, *, rate: float, burst: int) -> tuple[bool, int]:
    """Take one token; returns (allowed, seconds to wait before retrying). rate 0 = unlimited."""
    if rate <= 0:
        return True, 0
    if burst * LEASE_SHARE >= 2:
        return _take_leased(key, rate, burst, lease_size(rate, burst))
    if not availability.redis_breaker.allow():
        return True, 0  # Redis failed a moment ago: admit without waiting on it again
    try:
        granted, wait_ms = _call(key, rate, burst, time.time())
    except redis.RedisError as exc:
        return _failed(key, exc)
    return (True, 0) if granted else _refused(wait_ms)


def _failed(key: str, exc: redis.RedisError) -> tuple[bool, int]:
    """Admit when the limiter cannot answer. Only an outage opens the breaker: an error Redis
    answered (the script failed on this bucket) must not switch every other bucket off."""
    if isinstance(exc, redis.ResponseError):
        log.error("rate limiter failed on %s; admitting: %s", key, exc)
    else:
        availability.redis_breaker.failed()
        log.warning("rate limiter unavailable; admitting %s", key)
    return True, 0


def _take_leased(key: str, rate: float, burst: int, size: int) -> tuple[bool, int]:
    lease = _leases.get(key)
    if lease is None:
        with _lock:
            lease = _leases.setdefault(key, _Lease())
    if _spend(lease, time.monotonic()):
        return True, 0
    with lease.refill:
        if _spend(lease, time.monotonic()):
            return True, 0  # another thread's call refilled the lease while this one waited
        if not availability.redis_breaker.allow():
            return True, 0
        started = time.monotonic()
        with _lock:
            # What this process spent since its last call, scaled to a lease's life, is what it
            # asks for: a process that is not busy asks for one token, so it drops nothing.
            spent = lease.spent + 1
            elapsed = started - lease.fetched_at
            lease.tokens = 0  # dropped (if any are left, they expired): Redis forgets them too
            lease.spent = 0
        want = max(1, min(size, math.ceil(spent * LEASE_SECONDS / max(elapsed, 1e-3))))
        try:
            granted, wait_ms = _call(key, rate, burst, time.time(), want, _holder)
        except redis.RedisError as exc:
            return _failed(key, exc)
        with _lock:
            lease.fetched_at = started
            lease.expires = started + LEASE_SECONDS
            lease.tokens = max(0, granted - 1)
        return (True, 0) if granted else _refused(wait_ms)
