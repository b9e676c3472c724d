"""Input and output schemas of the todo surfaces (REST, MCP, CLI), and the one todo shape.

Every read that returns todos goes through ``todo_out`` (with ``admission_for`` of the same
todos), so the agent verbs, the operator routes and the CLI show a todo the same way.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Literal
from uuid import UUID

from django.conf import settings
from ninja import Schema
from pydantic import (
    AfterValidator,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    ValidationInfo,
    model_validator,
)

from queues.access import HUMAN_PREFIX
from queues.models import (
    BASIC_VERBS,
    GRANTABLE_VERBS,
    LIMIT_NAME_RE,
    MAX_ATTEMPT_SUMMARY,
    MAX_BURST,
    MAX_SCOPE_QUEUES,
    MAX_TODO_TAGS,
    POLICY_VERBS,
    QUEUE_NAME_RE,
    RATE_VERBS,
    SLUG_RE,
    Endpoint,
    Todo,
    TodoState,
    Verb,
)
from queues.selectors import MAX_PAGE, admission_for, endpoint_version, todo_explain
from switchboard.core import validation
from switchboard.core.times import iso


def QueueName() -> Any:
    return Field(pattern=QUEUE_NAME_RE, min_length=1, max_length=64)


def LimitName(description: str) -> Any:
    return Field(default=None, pattern=LIMIT_NAME_RE, max_length=64, description=description)


def AttemptOf() -> Any:
    return Field(
        default=None,
        ge=1,
        le=1_000_000,
        description="The attempt this caller holds (from its claim): refused with 409 "
        "'superseded' once the todo has been claimed again",
    )


def LeaseTtl() -> Any:
    return Field(default=None, ge=1, le=86400, description="Lease length; default per endpoint")


# A text the services keep stripped is not blank (said in the document only: the services' own
# answer names the rule).
NOT_BLANK: dict[str, Any] = {"pattern": validation.NOT_BLANK_RE}


def Claimant() -> Any:
    return Field(
        default=None,
        min_length=1,
        json_schema_extra=NOT_BLANK,
        max_length=200,
        description="who holds the claim (the endpoint's slug if not given); not starting "
        f"with {HUMAN_PREFIX!r}, which names a person's claim",
    )


TodoStateFilter = Literal["pending", "claimed", "done", "failed", "dead_letter", "discarded"]


def model_time(value: datetime | None) -> datetime | str | None:
    """A datetime for an answer its output model checks and pydantic writes (``todo_out``'s
    ``for_model``): a UTC datetime as it is, which pydantic writes as ``iso`` does; any other
    as ``iso``'s text."""
    if value is not None and value.tzinfo is UTC:
        return value
    return iso(value)


# --- outputs ----------------------------------------------------------------------------------


class Strict(Schema):
    """An input: unknown keys refused, and no coercion (``true`` is not 1, ``"300"`` not a
    number). Ids are the exception: a UUID arrives as a string (``Field(strict=False)``)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    @model_validator(mode="wrap")
    @classmethod
    def _run_root_validator(
        cls, values: Any, handler: ModelWrapValidatorHandler[Any], info: ValidationInfo
    ) -> Any:
        """ninja Schema's wrapping validator, replaced: an input is a JSON object, validated
        once as itself. ninja's validates a model that forbids extra keys twice, the second
        time through a ``DjangoGetter`` (attribute access for ORM objects), and runs every
        field's own validators twice (a stored JSON's walk and size): issue 11, every verb's
        input on REST and MCP. The first pass was this one, so the same errors. A number with no fraction is an integer, as in JSON Schema
        (``validation.integral_numbers``)."""
        return handler(validation.integral_numbers(cls, values))


def TodoId() -> Any:
    return Field(strict=False)


def StoredJson(description: str) -> Any:
    """A JSON field that is stored (payload, result, error): bounded as the README says."""
    return Field(default=None, description=description)


def _stored(value: Any, info: ValidationInfo) -> Any:
    return validation.check_stored_json(value, info.field_name or "value")


JsonValue = Annotated[Any, AfterValidator(_stored)]


class TodoAdmissionOut(Schema):
    state: Literal["admitted", "deferred"]
    reason: str | None = None
    next_eligible_at: datetime | None = None
    exact: bool


class GateStateOut(Schema):
    gate: str = Field(description="pause, budget, pool, tags or rate_limit")
    state: Literal["admits", "waives", "holds"]
    reason: str | None = None
    next_eligible_at: datetime | None = Field(
        default=None, description="While it holds: when it may pass (null: an operator must act)"
    )
    limits: list[str] = Field(default_factory=list, description="The named limits over")
    detail: str
    exact: bool = Field(
        default=False,
        description="next_eligible_at is certain (a window's reset, a rate limit's minute), "
        "not an estimate (a lease that may end sooner)",
    )


class TodoExplainOut(Schema):
    binding: str = Field(
        description="The gate that binds (the latest next_eligible_at), or none when claimable"
    )
    next_eligible_at: datetime | None = None
    gates: list[GateStateOut]


class TodoOut(Schema):
    id: UUID
    queue: str
    title: str
    kind: str
    payload: Any = None
    state: Literal["pending", "claimed", "done", "failed", "discarded"]
    owner: str
    attempt: int
    max_attempts: int
    lease_expires_at: datetime | None
    next_retry_at: datetime | None
    dead_letter: bool
    result: Any = None
    created_at: datetime
    updated_at: datetime
    pool: str | None = None
    tags: list[str] = Field(default_factory=list)
    rate_limit: str | None = None
    grant: str | None = Field(
        default=None,
        description="The claim's grant, while it lasts: the entry_hash of the limits.grant ledger row "
        "written when the claim passed a named limit (pool, tag, rate limit; not off)",
    )
    admission: TodoAdmissionOut | None = Field(
        default=None,
        description="Present on a pending todo of a budgeted queue: the budget's word only, "
        "whether its limits would admit a claim now, and if not, why and until when. A pause "
        "or a named limit is in explain (its binding gate).",
    )
    explain: TodoExplainOut | None = Field(
        default=None,
        description="On one pending todo (get_todo): every gate that may hold it, and the one "
        "that binds.",
    )


def todo_out(
    todo: Todo,
    admission: dict[str, Any] | None = None,
    *,
    for_model: bool = False,
) -> dict[str, Any]:
    """A todo as every surface shows it; ``admission`` is its entry in ``admission_for``.

    ``for_model``: for an answer its output model checks and pydantic writes (the agent verbs,
    through ``verbs.render`` and ``render_json``), the id and the UTC times as they are, which
    pydantic writes as ``str`` and ``iso`` do: the same JSON. Issue 11: writing them as text
    and parsing them back in the check cost a third of rendering a verb's answer (a claim's
    twice: its model's union is tried strictly first, which text fails).
    """
    time = model_time if for_model else iso
    out: dict[str, Any] = {
        "id": todo.id if for_model else str(todo.id),
        "queue": todo.queue,
        "title": todo.title,
        "kind": todo.kind,
        "payload": validation.shown(todo.payload),
        "state": todo.state,
        "owner": todo.owner,
        "attempt": todo.attempt,
        "max_attempts": todo.max_attempts,
        "lease_expires_at": time(todo.lease_expires_at),
        "next_retry_at": time(todo.next_retry_at),
        "dead_letter": todo.dead_letter,
        "result": validation.shown(todo.result),
        "created_at": time(todo.created_at),
        "updated_at": time(todo.updated_at),
        "pool": todo.pool,
        "tags": list(todo.tags),
        "rate_limit": todo.rate_limit,
        "grant": todo.grant_hash,
    }
    if admission is not None and todo.state == TodoState.PENDING:
        out["admission"] = {
            "state": admission["state"],
            "reason": admission.get("reason"),
            "next_eligible_at": iso(admission.get("next_eligible_at")),
            "exact": bool(admission.get("exact")),
        }
    return out


def todos_out(todos: list[Todo], *, for_model: bool = False) -> list[dict[str, Any]]:
    """Several todos, with one admission lookup for all of them."""
    statuses = admission_for(todos)
    return [todo_out(t, statuses.get(t.id), for_model=for_model) for t in todos]


def one_todo_out(todo: Todo, *, for_model: bool = False) -> dict[str, Any]:
    return todos_out([todo], for_model=for_model)[0]


def todo_detail_out(todo: Todo, *, for_model: bool = False) -> dict[str, Any]:
    """One todo with its explain (pending only): what get_todo answers on every surface."""
    out = one_todo_out(todo, for_model=for_model)
    explanation = todo_explain(todo)
    if explanation is not None:
        found = explanation.as_dict()
        found["next_eligible_at"] = iso(found["next_eligible_at"])
        for gate in found["gates"]:
            gate["next_eligible_at"] = iso(gate["next_eligible_at"])
        out["explain"] = found
    return out


class PauseInfoOut(Schema):
    reason: str
    by: str
    at: datetime


class DeferredLimitOut(Schema):
    kind: Literal["pool", "tag", "rate"]
    name: str


class DeferredQueueOut(Schema):
    queue: str
    reason: str | None = Field(
        description="Why the work waits: the gate's reason (window_exhausted, in_flight_full, "
        "a named limit's), or queue_paused"
    )
    pending: int = Field(
        description="How many of the caller's todos in the queue it holds back: pending, a "
        "lapsed claim or a due retry, each with attempts left"
    )
    next_eligible_at: datetime | None = None
    exact: bool
    # Shaped by the budget gate (admission.schemas.WindowUseOut); queues does not import it.
    window: dict[str, Any] | None = Field(
        default=None,
        description="window_exhausted: the window that holds the claim until next_eligible_at "
        "(limit, period, tz, start, weekday, used, window_resets_at, binding)",
    )
    pause: PauseInfoOut | None = Field(
        default=None,
        description="queue_paused: who paused the queue, when and why (it waits for a resume)",
    )
    limits: list[DeferredLimitOut] | None = Field(
        default=None,
        description="A named limit's reason (pool_full, tag_full, rate_limited, "
        "limit_quarantined): the limits holding the work",
    )


# --- agent verbs ------------------------------------------------------------------------------


class CreateTodoIn(Strict):
    queue: str = QueueName()
    title: str = Field(min_length=1, max_length=500, json_schema_extra=NOT_BLANK)
    kind: str = Field(default="", max_length=100)
    payload: JsonValue = StoredJson("Any JSON; an object by convention (limits in the README)")
    idempotency_key: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        description="While a todo with this key is live, creating again returns it",
    )
    max_attempts: int | None = Field(default=None, ge=1, le=100)
    pool: str | None = LimitName("A declared pool: the claim holds one of its slots")
    tags: list[Annotated[str, Field(pattern=LIMIT_NAME_RE, max_length=64)]] | None = Field(
        default=None,
        max_length=MAX_TODO_TAGS,
        description=f"Up to {MAX_TODO_TAGS} declared tags: the claim counts against each limit",
    )
    rate_limit: str | None = LimitName("A declared rate limit: the claim counts per minute")


class CreateTodoOut(Schema):
    todo: TodoOut
    created: bool
    differs: list[str] | None = Field(
        default=None,
        description="When created is false (the idempotency key's live todo is the answer): the "
        "fields in which that todo is not what this request asked for (queue, title, kind, "
        "payload, max_attempts, pool, tags, rate_limit); empty for a retry of the same request",
    )


class TodoIdIn(Strict):
    id: UUID = TodoId()


class TodoEnvelope(Schema):
    todo: TodoOut


class ListTodosIn(Strict):
    queue: str | None = Field(default=None, pattern=QUEUE_NAME_RE, max_length=64)
    state: TodoStateFilter | None = None
    limit: int = Field(default=50, ge=1, le=MAX_PAGE)
    cursor: str | None = Field(default=None, max_length=200)


class ListTodosOut(Schema):
    todos: list[TodoOut]
    paused_queues: list[str]
    next_cursor: str | None


class ClaimIn(Strict):
    id: UUID = TodoId()
    lease_ttl_seconds: int | None = LeaseTtl()
    require_fence: bool = Field(
        default=False, description="Issue a lease_token that every later transition must carry"
    )
    claimant: str | None = Claimant()


class ClaimNextIn(Strict):
    queue: str | None = Field(
        default=None,
        pattern=QUEUE_NAME_RE,
        max_length=64,
        description="One of the granted queues; default all of them",
    )
    lease_ttl_seconds: int | None = LeaseTtl()
    require_fence: bool = False
    claimant: str | None = Claimant()


class ClaimOut(Schema):
    todo: TodoOut
    attempt: int
    lease_token: str | None = Field(default=None, description="Present when fenced")
    grant: str | None = Field(
        default=None,
        description="The claim's grant, while it lasts: the entry_hash of the limits.grant ledger row "
        "written when the claim passed a named limit (pool, tag, rate limit; not off)",
    )
    admission: dict[str, Any] | None = Field(
        default=None, description="The budget's headroom after this claim, on a budgeted queue"
    )


class ClaimNextOut(Schema):
    empty: bool
    todo: TodoOut | None = None
    attempt: int | None = None
    lease_token: str | None = None
    grant: str | None = Field(
        default=None,
        description="The claim's grant, while it lasts: the entry_hash of the limits.grant ledger row "
        "written when the claim passed a named limit (pool, tag, rate limit; not off)",
    )
    admission: dict[str, Any] | None = None
    deferred: list[DeferredQueueOut] | None = Field(
        default=None,
        description="When empty: the granted queues holding work back (admission, named limits, "
        "a pause), with how much and until when",
    )


class HeartbeatIn(Strict):
    id: UUID = TodoId()
    lease_ttl_seconds: int | None = LeaseTtl()
    lease_token: str | None = Field(default=None, max_length=200)
    attempt: int | None = AttemptOf()


class CompleteIn(Strict):
    id: UUID = TodoId()
    result: JsonValue = StoredJson("Any JSON (limits in the README)")
    summary: str = Field(default="", max_length=MAX_ATTEMPT_SUMMARY)
    lease_token: str | None = Field(default=None, max_length=200)
    attempt: int | None = AttemptOf()


class FailIn(Strict):
    id: UUID = TodoId()
    error: JsonValue = StoredJson("Any JSON (limits in the README)")
    summary: str = Field(default="", max_length=MAX_ATTEMPT_SUMMARY)
    lease_token: str | None = Field(default=None, max_length=200)
    attempt: int | None = AttemptOf()
    rate_limited: bool = Field(
        default=False,
        description="The work met a 429: one observation against the todo's rate limit",
    )


class ReleaseIn(Strict):
    id: UUID = TodoId()
    lease_token: str | None = Field(default=None, max_length=200)
    attempt: int | None = AttemptOf()


# --- operators --------------------------------------------------------------------------------


# What the services check and say in their own words (``endpoints.vend``), stated in the document
# only (``json_schema_extra``), so the answer keeps naming the rule rather than a pattern.
_SCOPE_QUEUE = Annotated[str, Field(json_schema_extra={"pattern": QUEUE_NAME_RE})]
_GRANTED_VERB = Annotated[str, Field(json_schema_extra={"enum": list(GRANTABLE_VERBS)})]
# A hook URL is kept stripped: http(s) in printable ASCII (``hookguard.check_url``), or blank
# (no hook).
_HOOK_URL = Annotated[
    str,
    Field(
        json_schema_extra={
            "pattern": rf"^[{validation.SPACE_CLASS}]*(?:[hH][tT][tT][pP][sS]?://[!-~]+)?"
            rf"[{validation.SPACE_CLASS}]*$"
        }
    ),
]
_GRANTED_VERBS = Annotated[list[_GRANTED_VERB], Field(json_schema_extra={"minItems": 1})]


class VendIn(Strict):
    name: str = Field(min_length=1, max_length=200, json_schema_extra=NOT_BLANK)
    queues: list[_SCOPE_QUEUE] = Field(min_length=1, max_length=MAX_SCOPE_QUEUES)
    verbs: _GRANTED_VERBS | None = Field(
        default=None,
        description="Default: the basic grant (the todo verbs). Grantable: "
        + ", ".join(GRANTABLE_VERBS),
    )
    lease_ttl_seconds: int | None = Field(default=None, ge=1, le=86400)
    rps: float | None = Field(
        default=None, ge=0, le=100000, description="Request rate limit; 0 = unlimited"
    )
    burst: int | None = Field(default=None, ge=1, le=MAX_BURST)
    slug: str | None = Field(default=None, pattern=SLUG_RE, max_length=63)
    owner: str | None = Field(
        default=None, max_length=150, description="Username of the owner (superusers only)"
    )
    notify_url: _HOOK_URL | None = Field(
        default=None,
        max_length=500,
        description="Where to POST a signed ready hook (http(s), a public host); its signing "
        "secret is answered once, as hook_secret",
    )


class EndpointPatchIn(Strict):
    """What may change after vend; a field left out is left as it is. ``null`` clears the lease
    TTL, rate and burst (the fleet's defaults then) and the hook URL (and its secret)."""

    # Optional, never defaulted (only the fields sent are read): no default in the schema,
    # where "" would break its own minLength.
    name: str = Field(
        default_factory=str, min_length=1, max_length=200, json_schema_extra=NOT_BLANK
    )
    lease_ttl_seconds: int | None = Field(default=None, ge=1, le=86400)
    rps: float | None = Field(
        default=None, ge=0, le=100000, description="Request rate limit; 0 = unlimited"
    )
    burst: int | None = Field(default=None, ge=1, le=MAX_BURST)
    notify_url: _HOOK_URL | None = Field(default=None, max_length=500)


class RotateHookSecretIn(Strict):
    overlap_seconds: int | None = Field(
        default=None,
        ge=0,
        le=30 * 86400,
        description="How long the old secret still signs beside the new one (default "
        "HOOK_SECRET_OVERLAP_SECONDS; 0 drops it at once)",
    )


class EndpointOut(Schema):
    id: UUID
    slug: str
    name: str
    owner: str
    state: Literal["active", "revoked"]
    scope_queues: list[str]
    scope_verbs: list[str]
    default_lease_ttl_seconds: int | None
    rate_limit_rps: float | None
    rate_limit_burst: int | None
    token_prefix: str
    mcp_url: str
    last_seen_at: datetime | None
    created_at: datetime
    revoked_at: datetime | None
    hook_failed_at: datetime | None = Field(
        description="When a ready hook last gave up after every attempt (null once one succeeds)"
    )
    hook_error: str = Field(description="Why that hook gave up")
    hook_url: str = Field(
        description="Where ready hooks go: the hook URL's scheme, host and port, the rest shown "
        "as /… (it may carry the receiver's secret); empty when none is set"
    )
    version: str = Field(
        description="What may change after vend, as a version (the PATCH's ETag and If-Match)"
    )


class VerbFamilyOut(Schema):
    family: str
    verbs: list[str]
    note: str


class VendOut(Schema):
    endpoint: EndpointOut
    token: str = Field(description="Shown once; only its hash is stored")
    hook_secret: str | None = Field(
        default=None, description="The hook signing secret when notify_url was given, shown once"
    )
    mcp_url: str
    mcp_json: dict[str, Any] = Field(description="A ready .mcp.json snippet")
    grantable: list[VerbFamilyOut]


class EndpointPatchOut(Schema):
    endpoint: EndpointOut
    hook_secret: str | None = Field(
        description="The hook signing secret, shown once: answered when this change made one "
        "(a hook URL set where there was none), else null"
    )


class RotateHookSecretOut(Schema):
    endpoint: EndpointOut
    hook_secret: str = Field(description="The new signing secret, shown once")
    previous_secret_signs_until: datetime | None = Field(
        description="Until when the previous secret also signs (null: it no longer does)"
    )


class EndpointListOut(Schema):
    endpoints: list[EndpointOut]


class RevokeOut(Schema):
    endpoint: EndpointOut
    dead_lettered: int = Field(description="Live todos dead-lettered with endpoint_revoked")


class OperatorCreateTodoIn(CreateTodoIn):
    endpoint: str = Field(min_length=1, max_length=63, description="The endpoint's slug")


class TodoListOut(Schema):
    todos: list[TodoOut]
    next_cursor: str | None


class BulkSelectionIn(Strict):
    """Which todos a bulk action applies to, as the board filters them; every field optional."""

    endpoint: str | None = Field(
        default=None, min_length=1, max_length=63, description="An endpoint slug"
    )
    queue: str | None = Field(default=None, pattern=QUEUE_NAME_RE, min_length=1, max_length=64)
    state: Literal[TodoStateFilter, "live"] | None = Field(
        default=None, description="live = pending and claimed; none = every state"
    )
    q: str | None = Field(
        default=None, min_length=1, max_length=200, description="Title, payload text or id"
    )


class BulkConfirmIn(BulkSelectionIn):
    selection: str = Field(
        min_length=1,
        max_length=64,
        description="The selection token the preview answered: the action applies only if "
        "the selection is still exactly what the preview showed",
    )


class BulkPreviewOut(Schema):
    action: Literal["retry", "discard"]
    count: int
    sample: list[TodoOut]
    selection: str
    left_out: int = Field(
        default=0,
        description="retry: failed todos of the selection it leaves out (a revoked endpoint's, "
        "or one whose idempotency key another todo holds now); the count does not hold them",
    )


class BulkDoneOut(Schema):
    action: Literal["retry", "discard"]
    count: int
    todos: list[UUID]
    applied_at: datetime | None = Field(
        default=None,
        description="Set when this selection had been applied already by you (a repeated "
        "request): when it was. Nothing was changed by this one.",
    )


def mcp_url(endpoint: Endpoint) -> str:
    return f"{settings.PUBLIC_URL}/mcp/{endpoint.slug}"


def mcp_json(endpoint: Endpoint, token: str) -> dict[str, Any]:
    return {
        "mcpServers": {
            f"switchboard-{endpoint.slug}": {
                "type": "http",
                "url": mcp_url(endpoint),
                "headers": {"Authorization": f"Bearer {token}"},
            }
        }
    }


def endpoint_out(endpoint: Endpoint) -> dict[str, Any]:
    return {
        "id": str(endpoint.id),
        "slug": endpoint.slug,
        "name": endpoint.name,
        "owner": endpoint.owner.get_username(),
        "state": endpoint.state,
        "scope_queues": list(endpoint.scope_queues),
        "scope_verbs": list(endpoint.scope_verbs),
        "default_lease_ttl_seconds": endpoint.default_lease_ttl_seconds,
        "rate_limit_rps": endpoint.rate_limit_rps,
        "rate_limit_burst": endpoint.rate_limit_burst,
        "token_prefix": endpoint.token_prefix,
        "mcp_url": mcp_url(endpoint),
        "last_seen_at": iso(endpoint.last_seen_at),
        "created_at": iso(endpoint.created_at),
        "revoked_at": iso(endpoint.revoked_at),
        "hook_failed_at": iso(endpoint.hook_failed_at),
        "hook_error": endpoint.hook_error,
        "hook_url": endpoint.hook_origin,
        "version": endpoint_version(endpoint),
    }


def vend_out(endpoint: Endpoint, token: str) -> dict[str, Any]:
    """What a vend answers, on every surface: the token once, the MCP URL and snippet."""
    return {
        "endpoint": endpoint_out(endpoint),
        "token": token,
        "hook_secret": endpoint.notify_secret or None,
        "mcp_url": mcp_url(endpoint),
        "mcp_json": mcp_json(endpoint, token),
        "grantable": verb_families(),
    }


def verb_families() -> list[dict[str, Any]]:
    """What a vend may grant, by family, with what each family lets the agent do."""
    return [
        {
            "family": "basic",
            "verbs": list(BASIC_VERBS),
            "note": "The default grant: create, read and drain todos on the scoped queues.",
        },
        {
            "family": "admission_status",
            "verbs": [Verb.ADMISSION_STATUS.value, Verb.LIMITS_STATUS.value],
            "note": "Read the budgets of the scoped queues and the fleet's named limits; "
            "implied by claim or claim_next.",
        },
        {
            "family": "policy",
            "verbs": list(POLICY_VERBS),
            "note": "set/clear_admission_policy lets the agent change its own budget; never "
            "part of the basic grant.",
        },
        {
            "family": "rate",
            "verbs": list(RATE_VERBS),
            "note": "report_rate_limited halves a shared rate limit for every agent naming it; "
            "never part of the basic grant.",
        },
    ]
