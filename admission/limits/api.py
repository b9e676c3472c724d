"""The operators' limits API (humans: session or ``sbh_`` token), mounted at /api/v1/.

- ``GET /limits``: every declared limit with how full it is now (``limits_status``);
- ``PUT /limits/{kind}/{name}``: declare it or change the fields given (``kind``: pool, tag, rate);
- ``DELETE /limits/{kind}/{name}``: remove a limit no live todo names;
- ``POST /limits/{kind}/{name}/quarantine``: a pool or tag to 0, its claims expired (the manifest);
- ``PUT /limits/queues/{queue}``: a queue name's priority and aging;
- ``GET /limits/status``: the ``limits status`` projection; ``GET /limits/verify``: the
  ``limits verify`` report (``ok`` false naming the bad row or each grant in drift), rationed
  per person as the console's "Verify now" is.

A limit's ``version`` is its entity tag (the PUT's ``ETag``); PUT and DELETE honour ``If-Match``
(that version, or ``*``) and PUT ``If-None-Match: *`` (declare only), as the budget API does:
412 ``precondition_failed`` with the version now, nothing written.

Any signed-in human reads; changing a fleet-wide limit needs the limits change permission
(superusers). Handlers are thin: ``admission.limits.selectors`` and ``services``.
"""

from __future__ import annotations

from typing import Any, Literal

from django.http import HttpRequest, HttpResponse
from ninja import Router, Schema
from pydantic import Field

from admission.limits import selectors, services
from admission.limits.models import MAX_DECAY_STEP, MAX_DECAY_WINDOW_SECONDS, MAX_LIMIT
from queues.access import HumanActor
from queues.auth import HumanAuth
from queues.schemas import Strict
from switchboard.core.errors import InvalidArgument
from switchboard.core.http import (
    ErrorOut,
    entity_tag,
    if_match_header,
    if_none_match_header,
    write_preconditions,
)

router = Router(tags=["limits"], auth=HumanAuth())

WRITE_ERRORS: dict[int, Any] = {
    400: ErrorOut,
    401: ErrorOut,
    403: ErrorOut,
    404: ErrorOut,
    409: ErrorOut,
}
CONDITIONAL_ERRORS: dict[int, Any] = {**WRITE_ERRORS, 412: ErrorOut}
IF_MATCH = if_match_header("any limit")
IF_NONE_MATCH = if_none_match_header("declare only, where it is not declared yet")
IF_MATCH_SETTINGS = if_match_header("any settings")
IF_NONE_MATCH_SETTINGS = if_none_match_header("create only, where the queue has none yet")


# The kinds a path names (``/limits/queues/{queue}`` is a queue's priority, not a kind).
LimitKind = Literal["pool", "tag", "rate"]


# A pool or tag limit (a rate limit cannot be quarantined: nothing holds it).
HeldKind = Literal["pool", "tag"]


def _bounded(lowest: int, highest: int, description: str) -> Any:
    """A number field with the service's bounds in the document (the service checks them too,
    for the callers that are not the API)."""
    return Field(default=None, ge=lowest, le=highest, description=description)


class LimitIn(Strict):
    """Only the fields of the limit's kind; a field left out keeps its value (or default)."""

    slots: int | None = _bounded(0, MAX_LIMIT, "pool: claims naming it at once")
    limit: int | None = _bounded(0, MAX_LIMIT, "tag: claims naming it at once")
    base_limit: int | None = _bounded(1, MAX_LIMIT, "rate: claims per minute")
    floor: int | None = _bounded(1, MAX_LIMIT, "rate: the least claims per minute")
    decay_window_seconds: int | None = _bounded(1, MAX_DECAY_WINDOW_SECONDS, "rate: a 429's reach")
    decay_step: int | None = _bounded(
        0, MAX_DECAY_STEP, "rate: halvings per 429 in the window (0: no decay)"
    )
    posture: Literal["enforce", "advise", "off"] | None = None


class LimitOut(Schema):
    kind: LimitKind
    name: str
    posture: str
    slots: int | None = None
    limit: int | None = None
    base_limit: int | None = None
    floor: int | None = None
    decay_window_seconds: int | None = None
    decay_step: int | None = None
    version: str = Field(
        description="The limit's version: changes with every write that changes it (the ETag)"
    )
    held: int | None = None
    effective_limit: int | None = None
    observations: int | None = None
    used_this_minute: int | None = None


class LimitListOut(Schema):
    limits: list[LimitOut]


def _actor(request: HttpRequest) -> HumanActor:
    actor: HumanActor = request.auth  # type: ignore[attr-defined]
    return actor


@router.get("/limits", response={200: LimitListOut, 401: ErrorOut}, summary="List limits")
def list_limits(request: HttpRequest) -> dict[str, Any]:
    """Every pool, tag limit and rate limit, with its occupancy (or effective limit) now."""
    return {"limits": selectors.limits_status()}


class QueueSettingsIn(Strict):
    priority: int | None = _bounded(-MAX_LIMIT, MAX_LIMIT, "higher is claimed first")
    aging_seconds: int | None = _bounded(
        1, MAX_DECAY_WINDOW_SECONDS, "seconds of the oldest todo's wait per priority step"
    )
    clear_aging: bool = Field(default=False, description="remove the aging")


class QueueSettingsOut(Schema):
    queue: str
    priority: int
    aging_seconds: int | None
    version: str = Field(description="the settings' version: the PUT's ETag, for If-Match")


class QuarantineOut(Schema):
    limit: LimitOut
    manifest: dict[str, Any]
    entry_hash: str


@router.get("/limits/status", response={200: dict[str, Any], 401: ErrorOut}, summary="Status")
def limits_status(request: HttpRequest) -> dict[str, Any]:
    """Pools, tags, rates, queue settings, grants held, waivers and quarantines."""
    return selectors.limits_overview()


@router.get(
    "/limits/verify",
    response={200: dict[str, Any], 401: ErrorOut, 403: ErrorOut, 429: ErrorOut},
    summary="Verify",
)
def limits_verify_report(request: HttpRequest) -> dict[str, Any]:
    """The ledger from genesis, then every pool/tag grant against the limit in force. It reads
    every ledger row, so each person may ask as often as the console's "Verify now"
    (``LEDGER_VERIFY_RATE_LIMIT``): over it, 429 with Retry-After. Auditors and superusers
    only (403): it is the fleet's."""
    return services.limits_verify_now(actor=_actor(request)).as_dict()


@router.put(
    "/limits/queues/{queue}",
    response={200: QueueSettingsOut, **CONDITIONAL_ERRORS},
    summary="Set a queue's priority",
)
def put_queue_settings(
    request: HttpRequest,
    response: HttpResponse,
    queue: str,
    payload: QueueSettingsIn,
    if_match: str | None = IF_MATCH_SETTINGS,
    if_none_match: str | None = IF_NONE_MATCH_SETTINGS,
) -> Any:
    """Create or change a queue name's priority and aging (a ledger row when it changed). With
    If-Match (the ETag read) only over that version; with If-None-Match: * only where the queue
    has no settings yet: else 412."""
    out = services.queue_settings_set(
        actor=_actor(request),
        queue=queue,
        expected=write_preconditions(if_match, if_none_match),
        **payload.model_dump(),
    )
    response["ETag"] = entity_tag(out["version"])
    return out


@router.post(
    "/limits/{kind}/{name}/quarantine",
    response={200: QuarantineOut, **WRITE_ERRORS},
    summary="Quarantine a pool or tag",
)
def quarantine(request: HttpRequest, kind: HeldKind, name: str) -> Any:
    """Limit to 0 under enforce and expire every claim naming it, in one transaction."""
    done = services.limit_quarantine(actor=_actor(request), kind=kind, name=name)
    return {**done, "limit": selectors.limit_status(done["limit"])}


@router.put(
    "/limits/{kind}/{name}", response={200: LimitOut, **CONDITIONAL_ERRORS}, summary="Set a limit"
)
def put_limit(
    request: HttpRequest,
    response: HttpResponse,
    kind: LimitKind,
    name: str,
    payload: LimitIn,
    if_match: str | None = IF_MATCH,
    if_none_match: str | None = IF_NONE_MATCH,
) -> dict[str, Any]:
    """Declare the limit, or change the fields given. Each change is a ledger row. With
    If-Match (the ETag read) only over that version; with If-None-Match: * only where it is not
    declared: else 412."""
    given = payload.model_dump(exclude_none=True)
    expected = write_preconditions(if_match, if_none_match)
    out = selectors.limit_status(
        services.limit_set(actor=_actor(request), kind=kind, name=name, expected=expected, **given)
    )
    response["ETag"] = entity_tag(out["version"])
    return out


@router.delete(
    "/limits/{kind}/{name}",
    response={204: None, **CONDITIONAL_ERRORS},
    summary="Delete a limit",
)
def delete_limit(
    request: HttpRequest, kind: LimitKind, name: str, if_match: str | None = IF_MATCH
) -> HttpResponse:
    """Remove a limit no live todo names (the ledger keeps it as ``before``). With If-Match,
    only that version (or, for *, any): else 412. If-None-Match means nothing on a delete (there
    is nothing to create): 400 naming it, nothing deleted."""
    if "If-None-Match" in request.headers:
        raise InvalidArgument(
            "a delete takes If-Match, not If-None-Match (which would only create): nothing was "
            "deleted",
            field="If-None-Match",
        )
    expected = write_preconditions(if_match, None)
    services.limit_delete(actor=_actor(request), kind=kind, name=name, expected=expected)
    return HttpResponse(status=204)
