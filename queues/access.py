"""Access: who is acting, and what they may see or change.

An actor is an agent (an endpoint's token) or a human (a session or a personal token). A human's
roles (superuser, auditor, may pause) are looked up once per actor and cached on it, so a page
that asks many times costs one query. The rules live here, once: auditors read everything and
change nothing (a superuser in the group still writes); owners see and change their own
endpoints' work; ``queues.pause_queue`` pauses any queue.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import tzinfo
from typing import TYPE_CHECKING, Any
from uuid import UUID

from django.contrib.auth import get_user_model
from django.db.models import Q, QuerySet
from django.http import HttpRequest, HttpResponse

from queues.models import QUARANTINE_QUEUE, Endpoint, EndpointState, Todo
from switchboard.core.errors import Conflict, Forbidden, NotFound
from switchboard.core.pages import TZ_COOKIE, refusal
from switchboard.core.zones import zone_named
from switchboard.ledger import chain as ledger

if TYPE_CHECKING:
    from django.contrib.auth.models import AbstractBaseUser, AnonymousUser


@dataclass(frozen=True)
class AgentActor:
    endpoint: Endpoint
    via: str = "api"

    @property
    def label(self) -> str:
        return self.endpoint.slug


# A person's claim is held as operator:<username> (HumanActor.label); no agent's claimant may
# read so (queues.services.claiming).
HUMAN_PREFIX = "operator:"


@dataclass(frozen=True)
class HumanActor:
    user: AbstractBaseUser | AnonymousUser
    via: str = "api"

    @property
    def label(self) -> str:
        return f"{HUMAN_PREFIX}{self.user.get_username()}"

    @property
    def is_superuser(self) -> bool:
        return bool(getattr(self.user, "is_superuser", False))

    @functools.cached_property
    def is_auditor(self) -> bool:
        """Looked up once per actor (a frozen dataclass still takes a cached property)."""
        return is_auditor(self.user)

    @functools.cached_property
    def can_pause(self) -> bool:
        """Superusers, and humans holding queues.pause_queue who are not auditors."""
        user = self.user
        if not getattr(user, "is_authenticated", False) or not getattr(user, "is_active", False):
            return False
        if self.is_superuser:
            return True
        has_perm = getattr(user, "has_perm", None)
        return not self.is_auditor and callable(has_perm) and bool(has_perm(PAUSE_PERMISSION))

    @property
    def sees_all(self) -> bool:
        """Auditors and superusers read every endpoint, todo, policy and ledger row."""
        return self.is_superuser or self.is_auditor

    @property
    def writes(self) -> bool:
        """Auditors read and change nothing (a superuser in the group still writes)."""
        return self.is_superuser or not self.is_auditor

    def owns(self, endpoint: Endpoint) -> bool:
        return bool(endpoint.owner_id == getattr(self.user, "pk", None))

    def may_change(self, endpoint: Endpoint) -> bool:
        """Whether this human may change the endpoint's work and budgets."""
        return self.is_superuser or (self.writes and self.owns(endpoint))


Actor = AgentActor | HumanActor


@dataclass(frozen=True)
class SystemActor:
    """No human acts: the machine operator's shell without ``--as``, the demo seed, a fixture.

    Writes made so pass no access check (whoever runs the process owns the database) and land
    in the ledger under ``system:<via>``, so every change has a row and a named actor.
    """

    via: str = "system"

    @property
    def label(self) -> str:
        return f"system:{self.via}"


# A tuple, not a union written in the call: that builds two union objects on every call (twice
# per claim cycle; issue 12).
_ACTOR_TYPES = (AgentActor, HumanActor, SystemActor)


def check_actor(actor: object) -> None:
    """Every service is told who acts. A missing actor is a programming error, never a silent
    pass: a write nobody answers for would have no ledger row and no access check."""
    if not isinstance(actor, _ACTOR_TYPES):
        raise TypeError(f"a service needs an actor (agent, human or system), not {actor!r}")


def human_or_system(user: Any, via: str) -> HumanActor | SystemActor:
    """The named human acting through ``via``, or the system when no human is named."""
    return HumanActor(user, via=via) if user is not None else SystemActor(via=via)


AUDITORS_GROUP = "auditors"
PAUSE_PERMISSION = "queues.pause_queue"


def is_auditor(user: AbstractBaseUser | AnonymousUser) -> bool:
    if not getattr(user, "is_authenticated", False):
        return False
    groups = getattr(user, "groups", None)
    return bool(groups is not None and groups.filter(name=AUDITORS_GROUP).exists())


def todo_scope(actor: Actor) -> Q:
    """The todos an actor may read: an agent its own; auditors and superusers every todo; an
    owner those of the endpoints they own. (Writes are scoped by the services, never by this.)"""
    return endpoint_q(actor)


def acting_endpoint_ids(actor: Actor) -> list[UUID]:
    """The endpoints whose todos this actor may act on: an agent its own; a human the active
    endpoints they own (every active one for a superuser)."""
    if isinstance(actor, AgentActor):
        return [actor.endpoint.id]
    qs = Endpoint.objects.filter(state=EndpointState.ACTIVE)
    if not actor.is_superuser:
        qs = qs.filter(owner_id=actor.user.pk)
    return list(qs.values_list("id", flat=True))


def can_pause(actor: Actor) -> bool:
    """Whether this actor may pause and resume queues (agents never; auditors never, unless
    superusers). The API, the pages, the admin and the CLI all ask this."""
    return isinstance(actor, HumanActor) and actor.can_pause


def check_pause(actor: Actor) -> None:
    if not isinstance(actor, HumanActor):
        raise Forbidden("only a human operator pauses or resumes a queue")
    if not actor.can_pause:
        raise Forbidden("pausing and resuming queues needs the queues.pause_queue permission")


def check_writes(actor: Actor, refusal: str = "auditors read; they do not change anything") -> None:
    """Auditors read and change nothing (agents' writes are scoped by the other checks)."""
    if isinstance(actor, HumanActor) and not actor.writes:
        raise Forbidden(refusal)


def check_acts_for(actor: HumanActor, user: Any, refusal: str) -> None:
    """A human writes for themself; only a superuser writes for someone else (vend an endpoint
    they will own, make or revoke their token, give them an endpoint)."""
    check_writes(actor)
    if not actor.is_superuser and getattr(user, "pk", None) != getattr(actor.user, "pk", None):
        raise Forbidden(refusal)


def people_q(actor: HumanActor, path: str = "pk") -> Q:
    """The users a human may name as the one they act for (``check_acts_for``'s rule as a
    filter): every user for a superuser, else only themself."""
    if actor.is_superuser:
        return Q()
    return Q(**{path: getattr(actor.user, "pk", None)})


def token_q(actor: HumanActor) -> Q:
    """The personal tokens a human may read: their own; every user's for auditors and
    superusers (who read everything)."""
    if actor.sees_all:
        return Q()
    return Q(user_id=getattr(actor.user, "pk", None))


def check_scope(actor: Actor, queue: str) -> None:
    """An agent reaches only the queues in its endpoint's scope (humans are scoped by endpoint)."""
    if isinstance(actor, AgentActor) and queue not in actor.endpoint.scope_queues:
        raise Forbidden(f"queue {queue!r} is not in this endpoint's scope", queue=queue)


def check_grant(actor: Actor, verb: str) -> None:
    """An agent uses only the verbs its endpoint's grant holds."""
    if isinstance(actor, AgentActor) and not actor.endpoint.holds(verb):
        raise Forbidden(f"this endpoint's grant does not include {verb}", verb=verb)


def may_change_policy(actor: Actor, endpoint: Endpoint, queue: str) -> bool:
    """Whether this actor may set or clear the budget of (endpoint, queue): the endpoint's owner
    or a superuser (never an auditor); an agent on its own endpoint and in scope (its grant is
    checked per verb by ``check_policy_write``). The quarantine queue never has a budget."""
    if queue == QUARANTINE_QUEUE:
        return False
    if isinstance(actor, AgentActor):
        return endpoint.id == actor.endpoint.id and queue in actor.endpoint.scope_queues
    return actor.may_change(endpoint)


def check_policy_write(actor: Actor, endpoint: Endpoint, queue: str, verb: str) -> None:
    """Refuse a budget write the actor may not make: an endpoint they may not read is not found
    (``check_endpoint``, called first by the lookup); here auditors, grants and scope."""
    check_writes(actor, "auditors read budgets; they do not change them")
    check_grant(actor, verb)
    check_scope(actor, queue)


def sees_fleet(actor: HumanActor) -> bool:
    """Whether the queue list shows every queue: readers of everything, and pausers (a pause is
    fleet-wide, so a pauser who owns no endpoint still sees what there is to pause)."""
    return actor.sees_all or actor.can_pause


def endpoint_q(actor: Actor, path: str = "endpoint") -> Q:
    """The rows an actor may read among those reached through an endpoint at ``path`` (todos,
    policies): an agent its own endpoint's; auditors and superusers all; an owner their own."""
    if isinstance(actor, AgentActor):
        return Q(**{f"{path}_id": actor.endpoint.id})
    if actor.sees_all:
        return Q()
    return Q(**{f"{path}__owner_id": getattr(actor.user, "pk", None)})


def check_endpoint(
    actor: Actor,
    endpoint: Endpoint,
    *,
    write: bool,
    missing: Exception,
    forbidden: str = "auditors read; they do not change anything",
) -> None:
    """Refuse an endpoint the actor may not read (``missing``: not found, so its existence does
    not leak) or, for a write, may not change (forbidden for auditors)."""
    if isinstance(actor, AgentActor):
        if endpoint.id != actor.endpoint.id:
            raise missing
        return
    if actor.is_superuser:
        return
    if actor.is_auditor:
        if write:
            raise Forbidden(forbidden)
        return
    if not actor.owns(endpoint):
        raise missing


def may_act(actor: HumanActor, endpoint: Endpoint) -> bool:
    """Whether this human may act on the endpoint's todos (create, claim, retry, release): an
    active endpoint they own, or any active one for a superuser; never an auditor."""
    return endpoint.state == EndpointState.ACTIVE and actor.may_change(endpoint)


# What an auditor is told when they try to change an endpoint or a todo.
AUDITORS_CHANGE_NO_WORK = "auditors read; they do not change endpoints or todos"


def check_todo_write(actor: Actor, endpoint: Endpoint) -> None:
    """Refuse a todo write on ``endpoint``: an agent's other endpoint is not found; an auditor is
    forbidden; a human needs ``may_act`` (a revoked endpoint is a conflict, not a refusal)."""
    if isinstance(actor, AgentActor):
        if actor.endpoint.id != endpoint.id:
            raise NotFound("no such endpoint")
        return
    check_writes(actor, AUDITORS_CHANGE_NO_WORK)
    if not actor.may_change(endpoint):
        raise Forbidden("only the endpoint's owner may change its todos")
    # For a superuser too: work pushed to a revoked endpoint waits for a claim that never comes.
    if endpoint.state != EndpointState.ACTIVE:
        raise Conflict("the endpoint is revoked")


def todo_to_change(actor: HumanActor, todo_id: UUID) -> Todo:
    """The todo an operator acts on (retry, release, discard): not found unless the actor may
    read it (``todo_scope``, so a todo they may not see does not leak), then forbidden to an
    auditor, who reads every todo and changes none (404 before 403)."""
    check_actor(actor)
    todo = Todo.objects.select_related("endpoint").filter(todo_scope(actor), pk=todo_id).first()
    if todo is None:
        raise NotFound("no such todo", id=str(todo_id))
    check_writes(actor, AUDITORS_CHANGE_NO_WORK)
    return todo


def ledger_q(actor: HumanActor) -> Q:
    """The ledger rows a human may read: every row for auditors and superusers; for an owner the
    rows of their endpoints' scopes and the pauses of the queue names those endpoints drain."""
    if actor.sees_all:
        return Q()
    endpoints = list(
        Endpoint.objects.filter(owner_id=getattr(actor.user, "pk", None)).values_list(
            "slug", "scope_queues"
        )
    )
    scopes = [f"endpoint:{slug}" for slug, _ in endpoints]
    queues = sorted({q for _, scope in endpoints for q in scope})
    return Q(scope__in=scopes) | Q(scope="queue", queue__in=queues)


def visible_endpoints(actor: HumanActor) -> QuerySet[Endpoint]:
    """Owners see their endpoints; auditors and superusers see all."""
    qs = Endpoint.objects.select_related("owner").order_by("slug")
    if actor.sees_all:
        return qs
    return qs.filter(owner_id=getattr(actor.user, "pk", None))


def visible_endpoint(actor: HumanActor, slug: str) -> Endpoint | None:
    """The endpoint of this slug if the human may see it (another owner's is None, as an
    unknown slug: its existence does not leak), for the API and the CLI alike."""
    return visible_endpoints(actor).filter(slug=slug).first()


@dataclass
class Viewer:
    """The signed-in human at a console page: the actor (roles resolved once) and their zone."""

    user: Any
    actor: HumanActor
    is_superuser: bool
    is_auditor: bool
    can_pause: bool
    tz_name: str
    tz: tzinfo

    @classmethod
    def of(cls, request: HttpRequest, via: str = "board") -> Viewer:
        user = request.user
        actor = HumanActor(user, via=via)
        tz_name, tz = zone_named(request.COOKIES.get(TZ_COOKIE))
        return cls(
            user=user,
            actor=actor,
            is_superuser=actor.is_superuser,
            is_auditor=actor.is_auditor,
            can_pause=actor.can_pause,
            tz_name=tz_name,
            tz=tz,
        )

    @property
    def sees_all(self) -> bool:
        return self.actor.sees_all

    @property
    def writes(self) -> bool:
        return self.actor.writes

    def owns(self, endpoint: Endpoint) -> bool:
        return self.actor.owns(endpoint)

    def can_write_budget(self, endpoint: Endpoint, queue: str) -> bool:
        """Whether to offer (and accept at a page) the budget editor: ``may_change_policy``."""
        return may_change_policy(self.actor, endpoint, queue)

    def can_act(self, endpoint: Endpoint) -> bool:
        """Whether to offer todo actions; the todo services decide."""
        return may_act(self.actor, endpoint)


def refuse_auditors(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """Auditors read and change nothing: a write they forge by hand is 403 before any service.

    The services refuse them too; this makes the answer the same on every write view.
    """

    @functools.wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not Viewer.of(request).writes:
            return refusal(request, Forbidden("auditors read; they do not change anything"))
        return view(request, *args, **kwargs)

    return wrapper


def ledger_actor(actor: Actor | SystemActor, *, owner: Any = None) -> ledger.Actor:
    """Who a ledger row names: a human by id and name; the system by its label; an agent by its
    endpoint and the human answerable for it (``owner``, else its endpoint's owner)."""
    if isinstance(actor, SystemActor):
        return ledger.Actor(human_name=actor.label)
    if isinstance(actor, AgentActor):
        human = owner if owner is not None else actor.endpoint.owner
        return ledger.Actor(
            human_id=getattr(human, "pk", None),
            human_name=human.get_username() if human is not None else "",
            endpoint_id=actor.endpoint.id,
            endpoint_slug=actor.endpoint.slug,
        )
    user = actor.user
    return ledger.Actor(human_id=getattr(user, "pk", None), human_name=user.get_username())


# Endpoint owners' usernames, for the ledger rows a claim's or an end's own statement writes (a
# grant, its end): the agent path never loads the owner, and the name changes rarely. A row names
# the owner as this process last read it, at most ``_OWNER_NAME_SECONDS`` ago.
_OWNER_NAME_SECONDS = 60.0
_owner_names: dict[int, tuple[float, str]] = {}


def _owner_name(owner_id: int | None) -> str:
    if owner_id is None:
        return ""
    hit = _owner_names.get(owner_id)
    if hit is not None and time.monotonic() - hit[0] < _OWNER_NAME_SECONDS:
        return hit[1]
    user_model = get_user_model()
    found = user_model.objects.filter(pk=owner_id).values_list(user_model.USERNAME_FIELD).first()
    name = str(found[0]) if found else ""
    _owner_names[owner_id] = (time.monotonic(), name)
    return name


# Where an endpoint object keeps the ledger actor its claims and endings last named, with what
# it was made of.
_CLAIM_LEDGER_ACTOR = "_switchboard_claim_ledger_actor"


def claim_ledger_actor(actor: Actor | SystemActor) -> ledger.Actor:
    """``ledger_actor`` without loading an agent's endpoint's owner on the claim path.

    An agent's is kept on its endpoint object and handed out again while what it names is
    unchanged (every completion names one: issue 12), so the grant parameters' cache
    (``queues.sql.grant_params``) finds the very same actor."""
    if isinstance(actor, AgentActor):
        endpoint = actor.endpoint
        owner_id = endpoint.owner_id
        names = (owner_id, _owner_name(owner_id), endpoint.id, endpoint.slug)
        kept = endpoint.__dict__.get(_CLAIM_LEDGER_ACTOR)
        if kept is not None and kept[0] == names:
            return kept[1]
        made = ledger.Actor(
            human_id=names[0], human_name=names[1], endpoint_id=names[2], endpoint_slug=names[3]
        )
        endpoint.__dict__[_CLAIM_LEDGER_ACTOR] = (names, made)
        return made
    return ledger_actor(actor)


def append_claim_waiver(*, kind: str, actor: Actor, todo: Any, **details: Any) -> None:
    """A claim admitted over a limit by the advise posture: one ledger row (HMAC-hashed in the
    signed chain) naming the todo, its attempt, who claimed it and the ``details`` of the excess.
    The human accountable is the one acting, or the agent's endpoint's owner."""
    owner = todo.endpoint.owner if isinstance(actor, AgentActor) else None
    ledger.append(
        kind=kind,
        actor=ledger_actor(actor, owner=owner),
        scope=f"endpoint:{todo.endpoint.slug}",
        queue=todo.queue,
        after={"todo": str(todo.id), "attempt": todo.attempt, **details},
    )
