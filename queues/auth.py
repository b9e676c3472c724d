"""Who is calling: agents by ``sbk_`` bearer token, humans by session or ``sbh_`` bearer token.

Tokens are looked up by their SHA-256 hash and the hashes compared in constant time. Unknown or
revoked tokens are 401 ``unauthorized``. Each endpoint's requests pass a token bucket shared
through Redis (ENDPOINT_RATE_LIMIT, overridable per endpoint; 0 is unlimited).
"""

from __future__ import annotations

import hmac
import threading
import time
from typing import Any

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, transaction
from django.db.models.signals import post_delete, post_save
from django.http import HttpRequest
from django.middleware.csrf import CsrfViewMiddleware
from django.utils import timezone
from ninja.security import HttpBearer
from ninja.security.base import AuthBase

from queues.access import AgentActor, HumanActor
from queues.models import Endpoint, EndpointState, HumanToken
from queues.services import touch_endpoint
from queues.sql import hot_cursor
from switchboard.core import ratelimit
from switchboard.core.errors import Forbidden, RateLimited, Unauthorized
from switchboard.core.tokens import ENDPOINT_TOKEN_PREFIX, HUMAN_TOKEN_PREFIX, hash_token

_ENDPOINT_FIELDS = list(Endpoint._meta.concrete_fields)
# Every agent request runs this lookup; as plain SQL it skips the ORM's query compilation, which
# cost more than the rest of a claim, and on the hot cursor (server-side binding, binary results)
# psycopg prepares it and loads uuids and timestamps without parsing text. The owner loads lazily
# where a waiver needs it.
_ENDPOINT_BY_HASH = (
    f"SELECT {', '.join(str(f.column) for f in _ENDPOINT_FIELDS)} FROM queues_endpoint "
    "WHERE token_hash = %s"
)


class _EndpointCache:
    """Endpoint rows by token hash, kept ``ENDPOINT_CACHE_SECONDS`` in this process.

    Every agent request authenticates, and the lookup was a third of a claim's database round
    trips. A change to an endpoint saved in this process (a revoke, an edit in the
    admin) empties the cache at once and again at commit; another process's change reaches this
    one within the TTL. The cache keeps the row's values, not a model: each request gets an
    Endpoint of its own.
    """

    def __init__(self) -> None:
        self._rows: dict[str, tuple[float, list[Any]]] = {}
        self._lock = threading.Lock()

    def get(self, digest: str, ttl: float) -> list[Any] | None:
        hit = self._rows.get(digest)
        if hit is None or time.monotonic() - hit[0] >= ttl:
            return None
        return hit[1]

    def put(self, digest: str, values: list[Any]) -> None:
        with self._lock:
            if len(self._rows) >= ENDPOINT_CACHE_SIZE:
                self._rows.clear()
            self._rows[digest] = (time.monotonic(), values)

    def clear(self) -> None:
        with self._lock:
            self._rows.clear()


ENDPOINT_CACHE_SIZE = 10_000
endpoint_cache = _EndpointCache()


def _forget_endpoints(**kwargs: Any) -> None:
    endpoint_cache.clear()
    # A row re-read before the change commits must not outlive it either.
    transaction.on_commit(endpoint_cache.clear)


post_save.connect(_forget_endpoints, sender=Endpoint, dispatch_uid="endpoint-cache-save")
post_delete.connect(_forget_endpoints, sender=Endpoint, dispatch_uid="endpoint-cache-delete")


def _endpoint_row(digest: str) -> list[Any] | None:
    ttl = settings.ENDPOINT_CACHE_SECONDS
    if ttl > 0:
        cached = endpoint_cache.get(digest, ttl)
        if cached is not None:
            return cached
    with hot_cursor() as cursor:
        cursor.execute(_ENDPOINT_BY_HASH, [digest])
        row = cursor.fetchone()
    if row is None:
        return None
    values = list(row)  # no field of Endpoint converts its database value (checked in tests)
    if ttl > 0:
        endpoint_cache.put(digest, values)
    return values


def endpoint_for_token(token: str) -> Endpoint | None:
    if not token.startswith(ENDPOINT_TOKEN_PREFIX):
        return None
    digest = hash_token(token)
    values = _endpoint_row(digest)
    if values is None:
        return None
    # Lists (scopes) are copied: no request can change what the next one reads.
    fresh = [list(v) if isinstance(v, list) else v for v in values]
    endpoint = Endpoint.from_db(DEFAULT_DB_ALIAS, [f.attname for f in _ENDPOINT_FIELDS], fresh)
    if not hmac.compare_digest(endpoint.token_hash, digest):
        return None
    if endpoint.state != EndpointState.ACTIVE:
        return None
    return endpoint


def human_for_token(token: str) -> Any:
    if not token.startswith(HUMAN_TOKEN_PREFIX):
        return None
    digest = hash_token(token)
    row = HumanToken.objects.select_related("user").filter(token_hash=digest).first()
    if row is None or row.revoked_at is not None or not hmac.compare_digest(row.token_hash, digest):
        return None
    if not row.user.is_active:
        return None
    now = timezone.now()
    if row.last_used_at is None or (now - row.last_used_at).total_seconds() > 60:
        HumanToken.objects.filter(pk=row.pk).update(last_used_at=now)
    return row.user


def endpoint_rate(endpoint: Endpoint) -> tuple[float, int]:
    rps, burst = settings.ENDPOINT_RATE_LIMIT
    if endpoint.rate_limit_rps is not None:
        rps = endpoint.rate_limit_rps
        burst = endpoint.rate_limit_burst or max(1, int(rps * 2))
    return rps, burst


def check_endpoint_rate(endpoint: Endpoint) -> None:
    rps, burst = endpoint_rate(endpoint)
    allowed, retry_after = ratelimit.take(f"endpoint:{endpoint.id}", rate=rps, burst=burst)
    if not allowed:
        raise RateLimited(
            f"endpoint {endpoint.slug} is over its request rate ({rps:g}/s, burst {burst})",
            retry_after=retry_after,
        )


def authenticate_agent(
    request: HttpRequest, token: str, *, via: str, charge_rate: bool = True
) -> AgentActor:
    """The agent behind ``token``; charges the endpoint's request rate unless the caller charges
    it itself (MCP charges tool calls only, so a low rate still lets a client connect)."""
    endpoint = endpoint_for_token(token)
    if endpoint is None:
        raise Unauthorized("the bearer token is unknown or revoked")
    if charge_rate:
        check_endpoint_rate(endpoint)
    touch_endpoint(endpoint)
    return AgentActor(endpoint=endpoint, via=via)


class AgentAuth(HttpBearer):
    """Bearer sbk_… for the agent verbs."""

    openapi_scheme = "bearer"

    def authenticate(self, request: HttpRequest, token: str) -> AgentActor | None:
        return authenticate_agent(request, token, via="api")


class HumanAuth(AuthBase):
    """A Django session (with CSRF on writes), or Bearer sbh_… personal access token."""

    openapi_type = "http"
    openapi_scheme = "bearer"

    def __call__(self, request: HttpRequest) -> HumanActor | None:
        header = request.headers.get("Authorization", "")
        if header.lower().startswith("bearer "):
            user = human_for_token(header[7:].strip())
            if user is None:
                raise Unauthorized("the bearer token is unknown or revoked")
            return HumanActor(user=user, via="api")
        user = getattr(request, "user", None)
        if user is not None and user.is_authenticated:
            if request.method not in ("GET", "HEAD", "OPTIONS"):
                _check_csrf(request)
            return HumanActor(user=user, via="api")
        return None


def _check_csrf(request: HttpRequest) -> None:

    def _noop(r: HttpRequest) -> Any:
        return None

    reason = CsrfViewMiddleware(_noop).process_view(request, _noop, (), {})
    if reason is not None:
        raise Forbidden("CSRF check failed for this session request")
