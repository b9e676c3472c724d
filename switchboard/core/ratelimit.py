"""Token buckets in Redis, shared by every process: per endpoint requests, per human policy writes.

One Lua script refills and takes atomically. If Redis cannot be reached the limiter fails open
(logged): a rate limit protects the service, it is not a correctness guarantee. A failure opens
the Redis breaker (``switchboard.core.availability``), so a stall costs one request its timeout.
"""

from __future__ import annotations

import logging
import math
import time

import redis

from switchboard.core import availability, counters

log = logging.getLogger(__name__)

# KEYS[1] bucket; ARGV: rate per second, burst, now (seconds, float). Returns {allowed, wait_ms}.
_TAKE = """
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local now = tonumber(ARGV[3])
local state = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local tokens = tonumber(state[1])
local at = tonumber(state[2])
if tokens == nil then tokens = burst; at = now end
tokens = math.min(burst, tokens + (now - at) * rate)
local allowed = 0
local wait_ms = 0
if tokens >= 1 then
  tokens = tokens - 1
  allowed = 1
else
  wait_ms = math.ceil((1 - tokens) / rate * 1000)
end
redis.call('HSET', KEYS[1], 'tokens', tokens, 'at', now)
redis.call('PEXPIRE', KEYS[1], math.ceil(burst / rate * 1000) + 1000)
return {allowed, wait_ms}
"""


def take(key: str, *, rate: float, burst: int) -> tuple[bool, int]:
    """Take one token; returns (allowed, seconds to wait before retrying). rate 0 = unlimited."""
    if rate <= 0:
        return True, 0
    if not availability.redis_breaker.allow():
        return True, 0  # Redis failed a moment ago: admit without waiting on it again
    try:
        allowed, wait_ms = counters.client().eval(
            _TAKE, 1, f"switchboard:bucket:{key}", rate, max(1, burst), time.time()
        )
    except redis.RedisError:
        availability.redis_breaker.failed()
        log.warning("rate limiter unavailable; admitting %s", key)
        return True, 0
    return bool(allowed), max(1, math.ceil(int(wait_ms) / 1000)) if not allowed else 0
