"""REST routes of the queues app: the agent verbs, and the operator routes for endpoints and todos.

Agent routes (``/api/v1/agent/<verb>``, bearer ``sbk_``) are generated from the verb registry
(``switchboard.core.verbs``), one POST per verb, the body being the verb's arguments. The grant is
checked with the credentials, before the body is read, so a verb outside ``scope_verbs`` is 403
whatever the body says.

Operator routes (humans: session or ``sbh_``): owners see and change their own endpoints and
todos, superusers all, auditors read all and change nothing (403). Foreign and unknown are both
404.
"""

from __future__ import annotations

import inspect
from typing import Any, Literal
from uuid import UUID

from django.http import HttpRequest, HttpResponse
from ninja import Query, Router, Schema
from ninja.responses import Response, Status
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from queues import access, selectors, services
from queues.access import AgentActor, HumanActor
from queues.auth import AgentAuth, HumanAuth, authenticate_agent
from queues.models import QUEUE_NAME_RE, Endpoint, TodoSource
from queues.schemas import (
    BulkConfirmIn,
    BulkDoneOut,
    BulkPreviewOut,
    BulkSelectionIn,
    CreateTodoOut,
    EndpointListOut,
    EndpointPatchIn,
    EndpointPatchOut,
    OperatorCreateTodoIn,
    RevokeOut,
    RotateHookSecretIn,
    RotateHookSecretOut,
    TodoEnvelope,
    TodoListOut,
    TodoStateFilter,
    VendIn,
    VendOut,
    endpoint_out,
    one_todo_out,
    todo_detail_out,
    todos_out,
    vend_out,
)
from queues.selectors import MAX_PAGE
from switchboard.core import verbs
from switchboard.core.errors import InvalidArgument, NotFound
from switchboard.core.http import ErrorOut, entity_tag, if_match_header, write_preconditions
from switchboard.core.times import iso
from switchboard.core.users import user_named

# --- agent verbs ------------------------------------------------------------------------------


class VerbAuth(AgentAuth):
    """Bearer sbk_… holding one verb: 401 unknown/revoked, 429 over the rate, 403 not granted."""

    def __init__(self, verb: str) -> None:
        super().__init__()
        self.verb = verb

    def authenticate(self, request: HttpRequest, token: str) -> AgentActor | None:
        actor = authenticate_agent(request, token, via="api")
        verbs.check_grant(actor, self.verb)
        return actor


def _errors(statuses: tuple[int, ...]) -> dict[Any, Any]:
    return {frozenset(statuses): ErrorOut}


def _verb_operation(spec: verbs.VerbSpec) -> Any:
    def operation(request: HttpRequest, data: BaseModel) -> HttpResponse:
        actor = request.auth  # type: ignore[attr-defined]
        return Response(verbs.call(actor, spec, data))

    # The body is the verb's own input model; a verb whose arguments are all optional accepts
    # an empty body.
    try:
        default: Any = spec.input()
    except ValidationError:
        default = inspect.Parameter.empty
    operation.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [
            inspect.Parameter(
                "request", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=HttpRequest
            ),
            inspect.Parameter(
                "data",
                inspect.Parameter.POSITIONAL_OR_KEYWORD,
                annotation=spec.input,
                default=default,
            ),
        ]
    )
    operation.__name__ = f"agent_{spec.name}"
    return operation


def build_agent_router() -> Router:
    """One POST per registered verb. Called once, by switchboard/api.py when it mounts the
    routers (not at import, so a verb module may import switchboard.api without a cycle)."""
    router = Router(tags=["agent"])
    for spec in verbs.load_verbs().values():
        router.add_api_operation(
            f"/{spec.name}",
            ["POST"],
            _verb_operation(spec),
            auth=VerbAuth(spec.name),
            response={200: spec.output, **_errors(spec.statuses)},
            operation_id=f"agent_{spec.name}",
            summary=spec.name,
            description=spec.description,
        )
    return router


# --- operators: endpoints ---------------------------------------------------------------------

human_auth = HumanAuth()
endpoints_router = Router(tags=["endpoints"], auth=human_auth)
todos_router = Router(tags=["todos"], auth=human_auth)

BulkAction = Literal["retry", "discard"]
IF_MATCH = if_match_header("any version")
READ_ERRORS = (400, 401, 403, 404)
WRITE_ERRORS = (400, 401, 403, 404, 409, 413)


def _refuse_auditor(actor: HumanActor) -> None:
    access.check_writes(actor, access.AUDITORS_CHANGE_NO_WORK)


def _visible_endpoints(actor: HumanActor) -> Any:
    return access.visible_endpoints(actor)


def _endpoint(actor: HumanActor, slug: str, *, field: str | None = None) -> Endpoint:
    """The endpoint ``slug`` names, as ``actor`` may see it; else 404, naming ``field`` when the
    slug came in a body or a query (not the path: there it is the resource itself)."""
    endpoint = access.visible_endpoint(actor, slug)
    if endpoint is None:
        raise NotFound("no such endpoint", slug=slug, **({"field": field} if field else {}))
    return endpoint


@endpoints_router.post(
    "",
    response={201: VendOut, **_errors(WRITE_ERRORS)},
    operation_id="endpoints_vend",
    summary="Vend an endpoint (its token is shown once)",
)
def vend(request: HttpRequest, data: VendIn) -> Any:
    actor: HumanActor = request.auth  # type: ignore[attr-defined]
    _refuse_auditor(actor)
    owner: Any = actor.user
    if data.owner is not None and data.owner != actor.user.get_username():
        access.check_acts_for(actor, None, "only a superuser may vend an endpoint for someone else")
        owner = user_named(data.owner)
        if owner is None:
            raise InvalidArgument(f"no user named {data.owner!r}", field="owner")
    endpoint, token = services.endpoint_vend(
        actor=actor,
        owner=owner,
        name=data.name,
        queues=data.queues,
        verbs=data.verbs,
        lease_ttl_seconds=data.lease_ttl_seconds,
        rps=data.rps,
        burst=data.burst,
        slug=data.slug,
        notify_url=data.notify_url or "",
    )
    endpoint = Endpoint.objects.select_related("owner").get(pk=endpoint.pk)
    return Status(201, vend_out(endpoint, token))


@endpoints_router.patch(
    "/{slug}",
    response={200: EndpointPatchOut, **_errors((*WRITE_ERRORS, 412))},
    operation_id="endpoints_update",
    summary="Change what may change after vend (name, lease TTL, rate, burst, hook URL)",
)
def update_endpoint(
    request: HttpRequest,
    response: HttpResponse,
    slug: str,
    data: EndpointPatchIn,
    if_match: str | None = IF_MATCH,
) -> Any:
    """Only the fields sent change; scope never widens (revoke and vend again). With If-Match
    (the endpoint's ``version``, its ETag) it writes only over that version: else 412 naming who
    changed it last. Setting a hook URL where there was none answers its signing secret once."""
    actor: HumanActor = request.auth  # type: ignore[attr-defined]
    endpoint = _endpoint(actor, slug)
    before = endpoint.notify_secret
    # Only the fields sent: a null hook URL clears it (and its secret).
    sent: dict[str, Any] = {
        field: (data.notify_url or "") if field == "notify_url" else getattr(data, field)
        for field in data.model_fields_set
    }
    changed = services.endpoint_update(
        endpoint=endpoint, actor=actor, expected=write_preconditions(if_match, None), **sent
    )
    changed = Endpoint.objects.select_related("owner").get(pk=changed.pk)
    response["ETag"] = entity_tag(selectors.endpoint_version(changed))
    return {
        "endpoint": endpoint_out(changed),
        "hook_secret": services.hook_secret_made(before, changed),
    }


@endpoints_router.post(
    "/{slug}/rotate-hook-secret",
    response={200: RotateHookSecretOut, **_errors(WRITE_ERRORS)},
    operation_id="endpoints_rotate_hook_secret",
    summary="A new signing secret for the endpoint's ready hooks, shown once",
)
def rotate_hook_secret(request: HttpRequest, slug: str, data: RotateHookSecretIn) -> Any:
    """The old secret still signs beside the new one for ``overlap_seconds`` (default
    HOOK_SECRET_OVERLAP_SECONDS; 0 drops it at once), so a receiver moved over late verifies
    every hook. 409 when the endpoint has no hook URL, or is revoked."""
    actor: HumanActor = request.auth  # type: ignore[attr-defined]
    endpoint = _endpoint(actor, slug)
    secret = services.endpoint_rotate_hook_secret(
        endpoint=endpoint, actor=actor, overlap_seconds=data.overlap_seconds
    )
    endpoint = Endpoint.objects.select_related("owner").get(pk=endpoint.pk)
    return {
        "endpoint": endpoint_out(endpoint),
        "hook_secret": secret,
        "previous_secret_signs_until": iso(endpoint.notify_secret_previous_until),
    }


class EndpointFilter(Schema):
    model_config = ConfigDict(extra="forbid")
    state: str | None = Field(default=None, pattern="^(active|revoked)$")


@endpoints_router.get(
    "",
    response={200: EndpointListOut, **_errors((400, 401))},
    operation_id="endpoints_list",
    summary="Endpoints you own (all of them for superusers and auditors)",
)
def list_endpoints(request: HttpRequest, filters: Query[EndpointFilter]) -> Any:
    actor: HumanActor = request.auth  # type: ignore[attr-defined]
    qs = _visible_endpoints(actor)
    if filters.state:
        qs = qs.filter(state=filters.state)
    return {"endpoints": [endpoint_out(e) for e in qs.order_by("slug")]}


@endpoints_router.post(
    "/{slug}/revoke",
    response={200: RevokeOut, **_errors(READ_ERRORS)},
    operation_id="endpoints_revoke",
    summary="Revoke an endpoint; its live todos are dead-lettered with endpoint_revoked",
)
def revoke(request: HttpRequest, slug: str) -> Any:
    actor: HumanActor = request.auth  # type: ignore[attr-defined]
    endpoint = _endpoint(actor, slug)
    count = services.endpoint_revoke(endpoint=endpoint, actor=actor)
    return {"endpoint": endpoint_out(endpoint), "dead_lettered": count}


# --- operators: todos -------------------------------------------------------------------------


@todos_router.post(
    "",
    response={201: CreateTodoOut, 200: CreateTodoOut, **_errors(WRITE_ERRORS)},
    operation_id="todos_create",
    summary="Put a todo on an owned endpoint's queue (200 with created: false for a live "
    "idempotency key)",
)
def create_todo(request: HttpRequest, data: OperatorCreateTodoIn) -> Any:
    actor: HumanActor = request.auth  # type: ignore[attr-defined]
    endpoint = _endpoint(actor, data.endpoint, field="endpoint")
    made = services.todo_create(
        actor=actor,
        endpoint=endpoint,
        queue=data.queue,
        title=data.title,
        kind=data.kind,
        payload=data.payload,
        idempotency_key=data.idempotency_key,
        max_attempts=data.max_attempts,
        pool=data.pool,
        tags=data.tags,
        rate_limit=data.rate_limit,
        source=TodoSource.API,
    )
    body = {"todo": one_todo_out(made.todo), "created": made.created}
    if not made.created:
        body["differs"] = made.differs
    return Status(201 if made.created else 200, body)


class TodoFilter(Schema):
    model_config = ConfigDict(extra="forbid")
    endpoint: str | None = Field(default=None, max_length=63, description="An endpoint slug")
    queue: str | None = Field(default=None, pattern=QUEUE_NAME_RE, max_length=64)
    state: TodoStateFilter | None = None
    cursor: str | None = Field(default=None, max_length=200)
    limit: int = Field(default=50, ge=1, le=MAX_PAGE)


@todos_router.get(
    "",
    response={200: TodoListOut, **_errors(READ_ERRORS)},
    operation_id="todos_list",
    summary="A page of todos of your endpoints, oldest first",
)
def list_todos(request: HttpRequest, filters: Query[TodoFilter]) -> Any:
    actor: HumanActor = request.auth  # type: ignore[attr-defined]
    endpoint = _endpoint(actor, filters.endpoint, field="endpoint") if filters.endpoint else None
    todos, next_cursor = selectors.todos_for(
        actor=actor,
        endpoint=endpoint,
        queue=filters.queue,
        state=filters.state,
        cursor=filters.cursor,
        limit=filters.limit,
    )
    return {"todos": todos_out(todos), "next_cursor": next_cursor}


def _selection(actor: HumanActor, data: BulkSelectionIn) -> selectors.Selection:
    """The selection ``data`` names; an endpoint the actor cannot see is 404 naming the field,
    as in a list or a create (a mistyped slug selected nothing: "0 to discard")."""
    if data.endpoint:
        _endpoint(actor, data.endpoint, field="endpoint")
    return selectors.Selection(
        endpoint=data.endpoint or "", queue=data.queue or "", state=data.state or "", q=data.q or ""
    )


@todos_router.post(
    "/bulk/{action}/preview",
    response={200: BulkPreviewOut, **_errors(WRITE_ERRORS)},
    operation_id="todos_bulk_preview",
    summary="What a bulk retry or discard of a selection would change (nothing changes): the "
    "count, a sample, and the selection token that confirms exactly this selection",
)
def bulk_preview(request: HttpRequest, action: BulkAction, data: BulkSelectionIn) -> Any:
    actor: HumanActor = request.auth  # type: ignore[attr-defined]
    _refuse_auditor(actor)
    preview = selectors.bulk_preview(actor=actor, action=action, selection=_selection(actor, data))
    return {
        "action": action,
        "count": preview.count,
        "sample": todos_out(preview.sample),
        "selection": preview.token,
        "left_out": preview.left_out,
    }


@todos_router.post(
    "/bulk/{action}",
    response={200: BulkDoneOut, **_errors(WRITE_ERRORS)},
    operation_id="todos_bulk",
    summary="Retry (failed todos back to pending) or discard (pending and failed todos, for "
    "good) every todo of a selection, confirmed by its preview's token; 409 stale_selection "
    "with the fresh count and token if anything moved since, and nothing changes",
)
def bulk(request: HttpRequest, action: BulkAction, data: BulkConfirmIn) -> Any:
    actor: HumanActor = request.auth  # type: ignore[attr-defined]
    _refuse_auditor(actor)
    done = services.todos_bulk(
        actor=actor, action=action, selection=_selection(actor, data), token=data.selection
    )
    return {
        "action": action,
        "count": done.count,
        "todos": done.todo_ids,
        "applied_at": done.applied_at,
    }


@todos_router.get(
    "/{id}",
    response={200: TodoEnvelope, **_errors(READ_ERRORS)},
    operation_id="todos_get",
    summary="One todo; a pending one with explain: every gate that may hold it and the one that "
    "binds",
)
def get_todo(request: HttpRequest, id: UUID) -> Any:
    actor: HumanActor = request.auth  # type: ignore[attr-defined]
    return {"todo": todo_detail_out(selectors.todo_get(actor=actor, todo_id=id))}


@todos_router.post(
    "/{id}/retry",
    response={200: TodoEnvelope, **_errors(WRITE_ERRORS)},
    operation_id="todos_retry",
    summary="A failed todo (waiting or dead-lettered) back to pending, with a fresh round of attempts",
)
def retry(request: HttpRequest, id: UUID) -> Any:
    actor: HumanActor = request.auth  # type: ignore[attr-defined]
    return {"todo": one_todo_out(services.todo_retry(actor=actor, todo_id=id))}


class ReleaseOptions(Schema):
    model_config = ConfigDict(extra="forbid")
    attempt: int | None = Field(
        default=None,
        ge=1,
        le=2**31 - 1,
        description="Release only this attempt (the one you saw): a claim taken over since is "
        "refused as superseded, not released",
    )


@todos_router.post(
    "/{id}/release",
    response={200: TodoEnvelope, **_errors(WRITE_ERRORS)},
    operation_id="todos_release",
    summary="Release a claim on an owned endpoint's todo (no lease token needed)",
)
def release(request: HttpRequest, id: UUID, options: Query[ReleaseOptions]) -> Any:
    actor: HumanActor = request.auth  # type: ignore[attr-defined]
    released = services.todo_release(actor=actor, todo_id=id, attempt=options.attempt)
    return {"todo": one_todo_out(released)}


@todos_router.post(
    "/{id}/discard",
    response={200: TodoEnvelope, **_errors(WRITE_ERRORS)},
    operation_id="todos_discard",
    summary="Discard a pending or failed todo: a terminal state, recorded in the ledger",
)
def discard(request: HttpRequest, id: UUID) -> Any:
    actor: HumanActor = request.auth  # type: ignore[attr-defined]
    return {"todo": one_todo_out(services.todo_discard(actor=actor, todo_id=id))}
