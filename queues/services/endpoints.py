"""Endpoints and personal tokens: vend, update, revoke; create and revoke a human token."""

from __future__ import annotations

import re
import secrets
from datetime import datetime

from django.conf import settings
from django.contrib.auth.models import User
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from queues import metrics, sql
from queues.models import (
    BASIC_VERBS,
    GRANTABLE_VERBS,
    SLUG_RE,
    Endpoint,
    EndpointState,
    HumanToken,
    check_queue_name,
)
from switchboard.core import tokens
from switchboard.core.errors import Conflict, InvalidArgument
from switchboard.core.tokens import ENDPOINT_TOKEN_PREFIX, HUMAN_TOKEN_PREFIX, hash_token


def resolve_lease_ttl(requested: int | None, endpoint: Endpoint) -> int:
    ttl = requested or endpoint.default_lease_ttl_seconds or settings.DEFAULT_LEASE_TTL_SECONDS
    if requested is not None and not 1 <= requested <= settings.MAX_LEASE_TTL_SECONDS:
        raise InvalidArgument(
            f"lease_ttl_seconds must be between 1 and {settings.MAX_LEASE_TTL_SECONDS}",
            field="lease_ttl_seconds",
        )
    return int(min(ttl, settings.MAX_LEASE_TTL_SECONDS))


def _slugify(name: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:50] or "endpoint"
    if not slug[0].isalnum():
        slug = "e" + slug
    return slug


def endpoint_vend(
    *,
    owner: User,
    name: str,
    queues: list[str],
    verbs: list[str] | None = None,
    lease_ttl_seconds: int | None = None,
    rps: float | None = None,
    burst: int | None = None,
    notify_url: str = "",
    slug: str | None = None,
) -> tuple[Endpoint, str]:
    """Create an endpoint and its token. The token is returned once and stored only as a hash."""
    name = (name or "").strip()
    if not name or len(name) > 200:
        raise InvalidArgument("name is required (at most 200 characters)", field="name")
    if not queues:
        raise InvalidArgument("queues must name at least one queue", field="queues")
    for q in queues:
        check_queue_name(q, field_name="queues")
    verbs = list(BASIC_VERBS) if verbs is None else verbs
    unknown = sorted(set(verbs) - set(GRANTABLE_VERBS))
    if unknown or not verbs:
        raise InvalidArgument(
            f"verbs must be drawn from {', '.join(GRANTABLE_VERBS)}"
            + (f"; unknown: {', '.join(unknown)}" if unknown else ""),
            field="verbs",
        )
    if lease_ttl_seconds is not None and not 1 <= lease_ttl_seconds <= 86400:
        raise InvalidArgument("lease_ttl_seconds must be between 1 and 86400", field="lease_ttl")
    if rps is not None and not 0 <= rps <= 100000:
        raise InvalidArgument("rps must be between 0 (unlimited) and 100000", field="rps")
    if burst is not None and burst < 1:
        raise InvalidArgument("burst must be at least 1", field="burst")
    if slug is not None and not re.match(SLUG_RE, slug):
        raise InvalidArgument("slug must be lowercase letters, digits and '-'", field="slug")
    token = tokens.mint(ENDPOINT_TOKEN_PREFIX)
    base = slug or _slugify(name)
    for n in range(100):
        candidate = base if n == 0 else f"{base[:56]}-{secrets.token_hex(3)}"
        try:
            with transaction.atomic():
                endpoint = Endpoint.objects.create(
                    slug=candidate,
                    name=name,
                    owner=owner,
                    token_hash=hash_token(token),
                    token_prefix=token[:12],
                    scope_queues=list(dict.fromkeys(queues)),
                    scope_verbs=list(dict.fromkeys(verbs)),
                    default_lease_ttl_seconds=lease_ttl_seconds,
                    rate_limit_rps=rps,
                    rate_limit_burst=burst,
                    notify_url=notify_url,
                    notify_secret=tokens.hook_secret() if notify_url else "",
                )
            return endpoint, token
        except IntegrityError:
            if slug is not None or Endpoint.objects.filter(slug=candidate).exists() is False:
                raise InvalidArgument(f"slug {candidate!r} is taken", field="slug") from None
    raise Conflict("could not find a free slug; name the endpoint differently")


def endpoint_revoke(*, endpoint: Endpoint) -> int:
    """Revoke an endpoint; its live todos are dead-lettered with result endpoint_revoked."""
    with transaction.atomic():
        locked = Endpoint.objects.select_for_update().get(pk=endpoint.pk)
        if locked.state == EndpointState.REVOKED:
            return 0
        now = timezone.now()
        locked.state = EndpointState.REVOKED
        locked.revoked_at = now
        locked.save(update_fields=["state", "revoked_at"])
        with connection.cursor() as cursor:
            cursor.execute(
                sql.REVOKE_SQL,
                [locked.id],
            )
            rows = cursor.fetchall()
        total = 0
        for queue, count in rows:
            metrics.completed(queue, "dead_lettered", count)
            total += count
        endpoint.state = locked.state
        endpoint.revoked_at = locked.revoked_at
        return total


def human_token_create(*, user: User, name: str = "api") -> tuple[HumanToken, str]:
    name = (name or "api").strip()[:100]
    token = tokens.mint(HUMAN_TOKEN_PREFIX)
    obj = HumanToken.objects.create(
        user=user, name=name, token_hash=hash_token(token), token_prefix=token[:12]
    )
    return obj, token


def human_token_revoke(*, token: HumanToken) -> bool:
    updated = HumanToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(
        revoked_at=timezone.now()
    )
    return updated == 1


def touch_endpoint(endpoint: Endpoint, now: datetime | None = None) -> None:
    """Record that an endpoint was seen, at most once a minute (a cheap compare-and-set)."""
    now = now or timezone.now()
    if endpoint.last_seen_at and (now - endpoint.last_seen_at).total_seconds() < 60:
        return
    Endpoint.objects.filter(pk=endpoint.pk).update(last_seen_at=now)
    endpoint.last_seen_at = now
