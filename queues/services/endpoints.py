"""Endpoints and personal tokens: vend, update, revoke; create and revoke a human token."""

from __future__ import annotations

import re
import secrets
import unicodedata
from collections.abc import Collection
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from queues import access, hookguard, metrics, selectors, sql, wakes
from queues.access import HumanActor, SystemActor
from queues.models import (
    BASIC_VERBS,
    GRANTABLE_VERBS,
    MAX_BURST,
    MAX_SCOPE_QUEUES,
    MAX_TOKEN_NAME,
    Endpoint,
    EndpointState,
    HumanToken,
    check_queue_name,
    check_slug,
    hook_origin,
    looks_like_uuid,
)
from switchboard.core import hotsettings, tokens, validation, versions
from switchboard.core.errors import Conflict, Forbidden, InvalidArgument, PreconditionFailed
from switchboard.core.tokens import ENDPOINT_TOKEN_PREFIX, HUMAN_TOKEN_PREFIX, hash_token
from switchboard.ledger import chain as ledger
from switchboard.ledger.models import LedgerKind


def resolve_lease_ttl(requested: int | None, endpoint: Endpoint) -> int:
    longest = hotsettings.setting("MAX_LEASE_TTL_SECONDS")
    ttl = (
        requested
        or endpoint.default_lease_ttl_seconds
        or hotsettings.setting("DEFAULT_LEASE_TTL_SECONDS")
    )
    if requested is not None and not 1 <= requested <= longest:
        raise InvalidArgument(
            f"lease_ttl_seconds must be between 1 and {longest}", field="lease_ttl_seconds"
        )
    return int(min(ttl, longest))


# Latin letters with no accent to drop, spelled as their languages write them without it.
_SPELLED = str.maketrans(
    {"ß": "ss", "æ": "ae", "ø": "o", "œ": "oe", "đ": "d", "ð": "d", "þ": "th", "ł": "l", "ı": "i"}
)


def _slugify(name: str) -> str:
    """A slug from ``name``'s letters and digits, accents dropped: "Café" composed or
    decomposed, and "ＣＡＦÉ", all give ``cafe`` (before, a composed é cut the word, ``caf``,
    and a decomposed one kept it, so names that read the same got different slugs); "Straße"
    gives ``strasse``, "Øst" ``ost``. Anything else not in a-z and 0-9 separates words."""
    decomposed = unicodedata.normalize("NFKD", name.lower().translate(_SPELLED))
    plain = "".join(c for c in decomposed if not unicodedata.combining(c))
    slug = re.sub(r"[^a-z0-9]+", "-", plain).strip("-")[:50] or "endpoint"
    if looks_like_uuid(slug):
        return "endpoint-" + slug[:40]  # slugs never have the shape of an id
    if not slug[0].isalnum():
        slug = "e" + slug
    return slug


def _check_burst(burst: int | None) -> None:
    if burst is not None and not 1 <= burst <= MAX_BURST:
        raise InvalidArgument(f"burst must be between 1 and {MAX_BURST}", field="burst")


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
    actor: HumanActor | SystemActor,
) -> tuple[Endpoint, str]:
    """Create an endpoint and its token. The token is returned once and stored only as a hash.

    ``actor`` is the human vending (or the system, when no human acts); only a superuser vends
    for someone else. The vend lands in the ledger in the same transaction.
    """
    access.check_actor(actor)
    if isinstance(actor, HumanActor):
        access.check_acts_for(
            actor, owner, "only a superuser may vend an endpoint for someone else"
        )
    name = validation.check_text(name or "", "name").strip()
    if not name or len(name) > 200:
        raise InvalidArgument("name is required (at most 200 characters)", field="name")
    if not queues:
        raise InvalidArgument("queues must name at least one queue", field="queues")
    if len(queues) > MAX_SCOPE_QUEUES:
        raise InvalidArgument(
            f"queues names {len(queues)} queues; the most is {MAX_SCOPE_QUEUES}", field="queues"
        )
    if not owner.is_active:
        raise InvalidArgument(f"owner {owner.get_username()} is deactivated", field="owner")
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
    _check_burst(burst)
    if slug is not None:
        check_slug(slug)
    notify_url = check_notify_url(notify_url)
    token = tokens.mint(ENDPOINT_TOKEN_PREFIX)
    fields: dict[str, Any] = {
        "name": name,
        "owner": owner,
        "token_hash": hash_token(token),
        "token_prefix": token[:12],
        "scope_queues": list(dict.fromkeys(queues)),
        "scope_verbs": list(dict.fromkeys(verbs)),
        "default_lease_ttl_seconds": lease_ttl_seconds,
        "rate_limit_rps": None if rps is None else rps + 0.0,  # -0.0 is 0.0
        "rate_limit_burst": burst,
        "notify_url": notify_url,
        "notify_secret": tokens.hook_secret() if notify_url else "",
    }
    base = slug or _slugify(name)
    with transaction.atomic():
        endpoint = _create_with_free_slug(base, slug is not None, fields)
        _append(LedgerKind.ENDPOINT_VEND, actor, endpoint, None, _audited(endpoint))
    return endpoint, token


def _create_with_free_slug(base: str, chosen: bool, fields: dict[str, Any]) -> Endpoint:
    """The endpoint under ``base``, or ``base-xxxxxx`` when that is taken and was not chosen."""
    for n in range(100):
        candidate = base if n == 0 else f"{base[:56]}-{secrets.token_hex(3)}"
        if looks_like_uuid(candidate):
            continue
        try:
            with transaction.atomic():
                return Endpoint.objects.create(slug=candidate, **fields)
        except IntegrityError:
            if chosen or Endpoint.objects.filter(slug=candidate).exists() is False:
                # The request is well formed; the name is another endpoint's: a conflict with
                # what exists (409), naming the field.
                raise Conflict(f"slug {candidate!r} is taken", field="slug") from None
    raise Conflict("could not find a free slug; name the endpoint differently")


def _lock(endpoint: Endpoint) -> Endpoint:
    """The endpoint's row for a change that keeps its key: ``FOR NO KEY UPDATE`` of that row
    alone, read by itself (its owner is read when asked for, unlocked).

    Not the owner's ``auth_user`` row, which ``select_related("owner")`` with a plain
    ``select_for_update`` locked too (``FOR UPDATE``): a write holding the ledger's chain
    checks its foreign key to that user at commit (``FOR KEY SHARE``) and waited for this one,
    which waited for the chain (an endpoint PATCH racing a pause, a resume or a priority
    change: a deadlock, and a 503 on either side). Nor a join at all: a locked row that
    another write changed meanwhile is checked again against the joined rows as first read,
    and a join that no longer matches drops it (as the budget's lock did). ``no_key``: a
    todo's insert checks its key to the endpoint at commit too, and need not wait for this."""
    locked: Endpoint = Endpoint.objects.select_for_update(no_key=True).get(pk=endpoint.pk)
    return locked


def endpoint_revoke(*, endpoint: Endpoint, actor: HumanActor | SystemActor) -> int:
    """Revoke an endpoint; its live todos are dead-lettered with result endpoint_revoked.
    Returns how many. On the endpoint passed in, the state and ``revoked_at`` become what this
    call wrote; one already revoked (before it was read, or by a revoke that won the race) is
    left as the caller read it, which is how a caller tells whether this call revoked it."""
    access.check_actor(actor)
    if isinstance(actor, HumanActor):
        _check_may_change(actor, endpoint)
    with transaction.atomic():
        locked = Endpoint.objects.select_for_update().get(pk=endpoint.pk)
        if locked.state == EndpointState.REVOKED:
            return 0
        before = _audited(locked)
        now = timezone.now()
        locked.state = EndpointState.REVOKED
        locked.revoked_at = now
        locked.save(update_fields=["state", "revoked_at"])
        wakes.revoked(locked.id)  # its open streams end at commit
        with connection.cursor() as cursor:
            # The claims it dead-letters end their grants: one limits.end row naming them.
            params = {"endpoint": locked.id, **sql.grant_params(access.ledger_actor(actor), "")}
            cursor.execute(sql.revoke_sql(), params)
            rows = cursor.fetchall()
        total = 0
        reopens: set[str] = set()
        for queue, count, keys in rows:
            metrics.completed(queue, "dead_lettered", count)
            total += count
            reopens.update(keys)
        # The dead-lettered claims free the pool and tag units they held: other endpoints' work
        # waiting on them rings ``reopened``, once per identity, after commit.
        if reopens:
            wakes.after_commit(lambda: wakes.reopen(reopens))
        _append(
            LedgerKind.ENDPOINT_REVOKE,
            actor,
            locked,
            before,
            {**_audited(locked), "dead_lettered": total},
        )
        endpoint.state = locked.state
        endpoint.revoked_at = locked.revoked_at
        return total


def endpoint_rotate_hook_secret(
    *,
    endpoint: Endpoint,
    actor: HumanActor | SystemActor,
    overlap_seconds: int | None = None,
) -> str:
    """A new signing secret for the endpoint's hooks; returns it (the receiver needs it).

    The old secret keeps signing beside the new one for ``overlap_seconds`` (default
    ``HOOK_SECRET_OVERLAP_SECONDS``; 0 drops it at once), so a receiver moved to the new secret
    late still verifies every hook. The rotation lands in the ledger (never the secrets: the
    rotation's time and overlap) in the same transaction.
    """
    access.check_actor(actor)
    if isinstance(actor, HumanActor):
        _check_may_change(actor, endpoint)
    if overlap_seconds is None:
        overlap_seconds = settings.HOOK_SECRET_OVERLAP_SECONDS
    if not 0 <= overlap_seconds <= 30 * 86400:
        raise InvalidArgument(
            "overlap_seconds must be between 0 and 2592000 (30 days)", field="overlap_seconds"
        )
    with transaction.atomic():
        locked = _lock(endpoint)
        if locked.state != EndpointState.ACTIVE:
            raise Conflict("the endpoint is revoked")
        if not locked.notify_url:
            raise Conflict("the endpoint has no hook URL, so no hook secret to rotate")
        before = _audited(locked)
        now = timezone.now()
        locked.notify_secret_previous = locked.notify_secret if overlap_seconds else ""
        locked.notify_secret_previous_until = (
            now + timedelta(seconds=overlap_seconds) if overlap_seconds else None
        )
        locked.notify_secret = tokens.hook_secret()
        locked.save(
            update_fields=[
                "notify_secret",
                "notify_secret_previous",
                "notify_secret_previous_until",
            ]
        )
        _append(
            LedgerKind.ENDPOINT_HOOK_SECRET_ROTATE,
            actor,
            locked,
            before,
            {
                **_audited(locked),
                "previous_secret_signs_until": _iso(locked.notify_secret_previous_until),
            },
        )
    endpoint.notify_secret = locked.notify_secret
    endpoint.notify_secret_previous = locked.notify_secret_previous
    endpoint.notify_secret_previous_until = locked.notify_secret_previous_until
    return locked.notify_secret


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment is not None else None


def human_token_create(
    *, user: User, name: str = "api", actor: HumanActor | SystemActor
) -> tuple[HumanToken, str]:
    """A personal token for ``user`` (shown once, stored as a hash). Only a superuser makes one
    for someone else."""
    access.check_actor(actor)
    if isinstance(actor, HumanActor):
        access.check_acts_for(actor, user, "only a superuser may create a token for someone else")
    if not user.is_active:  # its token would be refused at every use
        raise InvalidArgument(f"user {user.get_username()} is deactivated", field="user")
    name = validation.check_text(name or "", "name").strip() or "api"
    if len(name) > MAX_TOKEN_NAME:
        raise InvalidArgument(
            f"name is {len(name)} characters; the most is {MAX_TOKEN_NAME}", field="name"
        )
    token = tokens.mint(HUMAN_TOKEN_PREFIX)
    with transaction.atomic():
        obj = HumanToken.objects.create(
            user=user, name=name, token_hash=hash_token(token), token_prefix=token[:12]
        )
        _append_token(LedgerKind.TOKEN_CREATE, actor, obj)
    return obj, token


def human_token_revoke(*, token: HumanToken, actor: HumanActor | SystemActor) -> bool:
    access.check_actor(actor)
    if isinstance(actor, HumanActor):
        access.check_acts_for(actor, token.user, "only a superuser may revoke someone else's token")
    with transaction.atomic():
        updated = HumanToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(
            revoked_at=timezone.now()
        )
        if updated == 1:
            _append_token(LedgerKind.TOKEN_REVOKE, actor, token)
    return updated == 1


_UNSET: Any = object()


def check_notify_url(notify_url: str | None) -> str:
    """A hook URL, stripped ('' for none): http(s), at most 500 characters, and a host that
    resolves only to addresses the server may call (queues.hookguard)."""
    notify_url = validation.check_text(notify_url or "", "notify_url").strip()
    if not notify_url:
        return ""
    # A scheme in any case (schemes are case-insensitive); kept in lower case.
    if len(notify_url) > 500 or not notify_url.lower().startswith(("https://", "http://")):
        raise InvalidArgument("notify_url must be an http(s) URL", field="notify_url")
    try:
        return hookguard.check_url(notify_url)
    except hookguard.UnsafeHookAddress as exc:
        raise InvalidArgument(f"notify_url is refused: {exc}", field="notify_url") from exc


def hook_secret_made(before: str, endpoint: Endpoint) -> str | None:
    """The signing secret an update made (a hook URL set where there was none), to be shown
    once, given the secret the endpoint had before it; None when it made none."""
    made = endpoint.notify_secret
    return made if made and made != before else None


def endpoint_update(
    *,
    endpoint: Endpoint,
    actor: HumanActor | SystemActor,
    name: str = _UNSET,
    owner: User = _UNSET,
    notify_url: str = _UNSET,
    lease_ttl_seconds: int | None = _UNSET,
    rps: float | None = _UNSET,
    burst: int | None = _UNSET,
    expected: Collection[str] | None = None,
) -> Endpoint:
    """Change what may change after vend (scope never widens: revoke and vend again).

    ``expected``: change only an endpoint at one of these versions (``selectors.
    endpoint_version``, what a form showed), checked under the row lock; another is refused
    naming who changed it last, and nothing is written.

    Setting a notify URL creates the hook's signing secret when the endpoint has none, so every
    hook is signed with a real key; clearing the URL clears the secret. Only a superuser gives an
    endpoint to someone else. The change lands in the ledger (before and after) in the same
    transaction.
    """
    access.check_actor(actor)
    if isinstance(actor, HumanActor):
        _check_may_change(actor, endpoint)
        if owner is not _UNSET and owner.pk != endpoint.owner_id:
            access.check_acts_for(
                actor, owner, "only a superuser may give an endpoint to someone else"
            )
    changes: dict[str, Any] = {}
    if name is not _UNSET:
        name = validation.check_text(name or "", "name").strip()
        if not name or len(name) > 200:
            raise InvalidArgument("name is required (at most 200 characters)", field="name")
        changes["name"] = name
    if owner is not _UNSET:
        changes["owner"] = owner
    if notify_url is not _UNSET:
        changes["notify_url"] = check_notify_url(notify_url)
    if lease_ttl_seconds is not _UNSET:
        if lease_ttl_seconds is not None and not 1 <= lease_ttl_seconds <= 86400:
            raise InvalidArgument(
                "lease_ttl_seconds must be between 1 and 86400", field="lease_ttl"
            )
        changes["default_lease_ttl_seconds"] = lease_ttl_seconds
    if rps is not _UNSET:
        if rps is not None and not 0 <= rps <= 100000:
            raise InvalidArgument("rps must be between 0 (unlimited) and 100000", field="rps")
        changes["rate_limit_rps"] = None if rps is None else rps + 0.0  # -0.0 is 0.0
    if burst is not _UNSET:
        _check_burst(burst)
        changes["rate_limit_burst"] = burst
    with transaction.atomic():
        locked = _lock(endpoint)
        if locked.state != EndpointState.ACTIVE:
            raise Conflict("the endpoint is revoked")
        if not versions.holds(expected, selectors.endpoint_version(locked)):
            last = selectors.endpoint_last_change(locked)
            raise PreconditionFailed(
                f"endpoint {locked.slug} changed since it was read"
                + (f" ({last})" if last else "")
                + ": nothing was written; read it again to see the change",
                scope=f"endpoint:{locked.slug}",
                version=selectors.endpoint_version(locked),
            )
        before = _audited(locked)
        if "notify_url" in changes and changes["notify_url"] != locked.notify_url:
            # The failure shown was the old URL's: the new one has not failed (hooks10).
            changes["hook_failed_at"], changes["hook_error"] = None, ""
        for field_name, value in changes.items():
            setattr(locked, field_name, value)
        if not locked.notify_url:
            locked.notify_secret = locked.notify_secret_previous = ""
            locked.notify_secret_previous_until = None
        elif not locked.notify_secret:
            locked.notify_secret = tokens.hook_secret()
        locked.save()
        after = _audited(locked)
        if after != before:
            _append(LedgerKind.ENDPOINT_UPDATE, actor, locked, before, after)
    for field_name in [*changes, "notify_secret", "notify_secret_previous"]:
        setattr(endpoint, field_name, getattr(locked, field_name))
    return endpoint


def _check_may_change(actor: HumanActor, endpoint: Endpoint) -> None:
    access.check_writes(actor, access.AUDITORS_CHANGE_NO_WORK)
    if not actor.may_change(endpoint):
        raise Forbidden("only the endpoint's owner may change it")


def _audited(endpoint: Endpoint) -> dict[str, Any]:
    """What the ledger keeps of an endpoint (never its token or hook secret)."""
    owner = endpoint.owner
    return {
        "endpoint_id": str(endpoint.id),
        "slug": endpoint.slug,
        "name": endpoint.name,
        "owner": owner.get_username() if owner is not None else None,
        "state": endpoint.state,
        "scope_queues": list(endpoint.scope_queues),
        "scope_verbs": list(endpoint.scope_verbs),
        "default_lease_ttl_seconds": endpoint.default_lease_ttl_seconds,
        "rate_limit_rps": endpoint.rate_limit_rps,
        "rate_limit_burst": endpoint.rate_limit_burst,
        **_audited_hook_url(endpoint.notify_url),
        "signed_hooks": bool(endpoint.notify_secret),
    }


def _audited_hook_url(url: str) -> dict[str, str]:
    """A hook URL as the ledger keeps it: where hooks go (``Endpoint.hook_origin``), never the
    rest, which may carry a receiver's secret (a token in the path or the query) and could not be
    taken out of an append-only row; a keyed digest of the whole URL shows every change."""
    if not url:
        return {"notify_url": ""}
    return {
        "notify_url": hook_origin(url),
        "notify_url_digest": ledger.keyed_digest("notify_url", url),
    }


# Every change lands in the ledger: a human's under their name, one made with no acting human (the
# shell without --as, the demo seed, a test fixture, the bench) under the system actor's.
def _append(
    kind: str,
    actor: HumanActor | SystemActor,
    endpoint: Endpoint,
    before: dict[str, Any] | None,
    after: dict[str, Any] | None,
) -> None:
    ledger.append(
        kind=kind,
        actor=access.ledger_actor(actor),
        scope=f"endpoint:{endpoint.slug}",
        before=before,
        after=after,
    )


def _append_token(kind: str, actor: HumanActor | SystemActor, token: HumanToken) -> None:
    if actor is None:
        return
    ledger.append(
        kind=kind,
        actor=access.ledger_actor(actor),
        scope=f"user:{token.user.get_username()}",
        after={"token_prefix": token.token_prefix, "name": token.name},
    )


def touch_endpoint(endpoint: Endpoint, now: datetime | None = None) -> None:
    """Record that an endpoint was seen, at most once a minute (a cheap compare-and-set)."""
    now = now or timezone.now()
    if endpoint.last_seen_at and (now - endpoint.last_seen_at).total_seconds() < 60:
        return
    Endpoint.objects.filter(pk=endpoint.pk).update(last_seen_at=now)
    endpoint.last_seen_at = now
