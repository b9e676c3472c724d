"""The todo verbs: the basic grant, served as REST routes and MCP tools from one declaration each.

Thin callers of ``queues.services`` (writes) and ``queues.selectors`` (reads); every todo they
return goes through ``queues.schemas.todo_out`` (``for_model``: every answer here is checked by
its output model and written by pydantic, ``verbs.render``).
"""

from __future__ import annotations

from typing import Any

from queues import selectors, services
from queues.access import AgentActor
from queues.models import TodoSource
from queues.schemas import (
    ClaimIn,
    ClaimNextIn,
    ClaimNextOut,
    ClaimOut,
    CompleteIn,
    CreateTodoIn,
    CreateTodoOut,
    FailIn,
    HeartbeatIn,
    ListTodosIn,
    ListTodosOut,
    ReleaseIn,
    TodoEnvelope,
    TodoIdIn,
    iso,
    one_todo_out,
    todo_detail_out,
    todos_out,
)
from switchboard.core.verbs import Hints, verb

# What a claim can answer besides success: no such todo, not claimable or deferred (a budget
# that cannot be evaluated defers with reason admission_unavailable: it fails closed).
CLAIM_ERRORS = (404, 409)
TRANSITION_ERRORS = (404, 409)


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if hasattr(value, "isoformat"):
        return iso(value)
    return value


def _claimed(result: services.Claimed) -> dict[str, Any]:
    out: dict[str, Any] = {
        "todo": one_todo_out(result.todo, for_model=True),
        "attempt": result.attempt,
    }
    if result.lease_token is not None:
        out["lease_token"] = result.lease_token
    if result.grant is not None:
        out["grant"] = result.grant
    if result.admission is not None:
        out["admission"] = _jsonable(result.admission)
    return out


@verb(
    "create_todo",
    input=CreateTodoIn,
    output=CreateTodoOut,
    description="Put a todo on one of this endpoint's queues. With an idempotency_key, a live "
    "todo with the same key is returned instead (created: false).",
)
def create_todo(actor: AgentActor, data: CreateTodoIn) -> dict[str, Any]:
    made = services.todo_create(
        actor=actor,
        endpoint=actor.endpoint,
        queue=data.queue,
        title=data.title,
        kind=data.kind,
        payload=data.payload,
        idempotency_key=data.idempotency_key,
        max_attempts=data.max_attempts,
        pool=data.pool,
        tags=data.tags,
        rate_limit=data.rate_limit,
        source=TodoSource.MCP if actor.via == "mcp" else TodoSource.API,
    )
    answer = {"todo": one_todo_out(made.todo, for_model=True), "created": made.created}
    if not made.created:
        answer["differs"] = made.differs
    return answer


@verb(
    "get_todo",
    hints=Hints(read_only=True),
    input=TodoIdIn,
    output=TodoEnvelope,
    description="One todo of this endpoint by id. A pending todo carries explain: every gate "
    "that may hold it (pause, budget, pool, tags, rate_limit) with its state and "
    "next_eligible_at, and the one that binds.",
    errors=(404,),
)
def get_todo(actor: AgentActor, data: TodoIdIn) -> dict[str, Any]:
    return {
        "todo": todo_detail_out(selectors.todo_get(actor=actor, todo_id=data.id), for_model=True)
    }


@verb(
    "list_todos",
    hints=Hints(read_only=True),
    input=ListTodosIn,
    output=ListTodosOut,
    description="A page of this endpoint's todos, oldest first, optionally of one queue and "
    "state (dead_letter: failed for good). paused_queues names the granted queues paused now.",
)
def list_todos(actor: AgentActor, data: ListTodosIn) -> dict[str, Any]:
    todos, next_cursor = selectors.todos_for(
        actor=actor, queue=data.queue, state=data.state, limit=data.limit, cursor=data.cursor
    )
    return {
        "todos": todos_out(todos, for_model=True),
        "paused_queues": selectors.paused_among(list(actor.endpoint.scope_queues)),
        "next_cursor": next_cursor,
    }


@verb(
    "claim",
    input=ClaimIn,
    output=ClaimOut,
    description="Claim one todo by id and hold a lease on it. A deferred queue answers "
    "'deferred' (with next_eligible_at) and changes nothing.",
    errors=CLAIM_ERRORS,
)
def claim(actor: AgentActor, data: ClaimIn) -> dict[str, Any]:
    result = services.claim(
        actor=actor,
        todo_id=data.id,
        lease_ttl_seconds=data.lease_ttl_seconds,
        require_fence=data.require_fence,
        claimant=data.claimant,
    )
    return _claimed(result)


@verb(
    "claim_next",
    input=ClaimNextIn,
    output=ClaimNextOut,
    description="Claim the oldest claimable todo of the granted queues (or of one). Answers "
    '{"empty": true} when there is none, with "deferred" listing queues whose work admission '
    "holds back and when it may go.",
)
def claim_next(actor: AgentActor, data: ClaimNextIn) -> dict[str, Any]:
    result = services.claim_next(
        actor=actor,
        queue=data.queue,
        lease_ttl_seconds=data.lease_ttl_seconds,
        require_fence=data.require_fence,
        claimant=data.claimant,
    )
    if isinstance(result, services.NothingClaimable):
        out: dict[str, Any] = {"empty": True}
        if result.deferred:
            out["deferred"] = _jsonable(result.deferred)
        return out
    return {"empty": False, **_claimed(result)}


@verb(
    "heartbeat",
    hints=Hints(idempotent=True),
    input=HeartbeatIn,
    output=TodoEnvelope,
    description="Extend the lease of a todo this endpoint holds.",
    errors=TRANSITION_ERRORS,
)
def heartbeat(actor: AgentActor, data: HeartbeatIn) -> dict[str, Any]:
    todo = services.heartbeat(
        actor=actor,
        todo_id=data.id,
        lease_ttl_seconds=data.lease_ttl_seconds,
        lease_token=data.lease_token,
        attempt=data.attempt,
    )
    return {"todo": one_todo_out(todo, for_model=True)}


@verb(
    "complete",
    input=CompleteIn,
    output=TodoEnvelope,
    description="Finish a claimed todo with an optional result.",
    errors=TRANSITION_ERRORS,
)
def complete(actor: AgentActor, data: CompleteIn) -> dict[str, Any]:
    todo = services.complete(
        actor=actor,
        todo_id=data.id,
        result=data.result,
        summary=data.summary,
        lease_token=data.lease_token,
        attempt=data.attempt,
    )
    return {"todo": one_todo_out(todo, for_model=True)}


@verb(
    "fail",
    input=FailIn,
    output=TodoEnvelope,
    description="Fail a claimed todo: retried later with backoff, or dead-lettered at "
    "max_attempts.",
    errors=TRANSITION_ERRORS,
)
def fail(actor: AgentActor, data: FailIn) -> dict[str, Any]:
    todo = services.fail(
        actor=actor,
        todo_id=data.id,
        error=data.error,
        summary=data.summary,
        lease_token=data.lease_token,
        attempt=data.attempt,
        rate_limited=data.rate_limited,
    )
    return {"todo": one_todo_out(todo, for_model=True)}


@verb(
    "release",
    input=ReleaseIn,
    output=TodoEnvelope,
    description="Give a claimed todo back to the queue without spending a retry.",
    errors=TRANSITION_ERRORS,
)
def release(actor: AgentActor, data: ReleaseIn) -> dict[str, Any]:
    todo = services.release(
        actor=actor, todo_id=data.id, lease_token=data.lease_token, attempt=data.attempt
    )
    return {"todo": one_todo_out(todo, for_model=True)}
