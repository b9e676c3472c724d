"""Who is acting: an agent (an endpoint's token) or a human (session or personal token)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from django.db.models import Q

if TYPE_CHECKING:
    from django.contrib.auth.models import AbstractBaseUser, AnonymousUser

    from queues.models import Endpoint


@dataclass(frozen=True)
class AgentActor:
    endpoint: Endpoint
    via: str = "api"

    @property
    def label(self) -> str:
        return self.endpoint.slug


@dataclass(frozen=True)
class HumanActor:
    user: AbstractBaseUser | AnonymousUser
    via: str = "api"

    @property
    def label(self) -> str:
        return f"operator:{self.user.get_username()}"

    @property
    def is_superuser(self) -> bool:
        return bool(getattr(self.user, "is_superuser", False))

    @property
    def is_auditor(self) -> bool:
        return is_auditor(self.user)


Actor = AgentActor | HumanActor

AUDITORS_GROUP = "auditors"


def is_auditor(user: AbstractBaseUser | AnonymousUser) -> bool:
    if not getattr(user, "is_authenticated", False):
        return False
    groups = getattr(user, "groups", None)
    return bool(groups is not None and groups.filter(name=AUDITORS_GROUP).exists())


def todo_scope(actor: Actor) -> Q:
    """The todos an actor may read: an agent its own; auditors and superusers every todo; an
    owner those of the endpoints they own. (Writes are scoped by the services, never by this.)"""
    if isinstance(actor, AgentActor):
        return Q(endpoint_id=actor.endpoint.id)
    if actor.is_superuser or actor.is_auditor:
        return Q()
    return Q(endpoint__owner=actor.user)
