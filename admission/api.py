"""The operators' budget API (humans: session or ``sbh_`` token), mounted at /api/v1/ (the
paths below are its own).

- ``GET /admission``: the budgets the caller may read, with status and usage;
- ``GET /admission/{scope}/{queue}``: one budget, its status, the last 30 windows and the audit;
- ``PUT /admission/{scope}/{queue}``: create or fully replace it (body at most 16 KiB);
- ``DELETE /admission/{scope}/{queue}``: remove it (the ledger keeps its history).

A budget's ``version`` is its entity tag: GET and PUT send it as ``ETag``. PUT and DELETE honour
``If-Match`` (write only over the version read, or ``*``: any budget) and PUT ``If-None-Match: *``
(create only), answering 412 ``precondition_failed`` with the current ``version`` when the budget
is not as read; nothing is written then. Without them a write is unconditional.

``{scope}`` is ``endpoint:<slug-or-id>``. Only the owning human or a superuser changes a budget;
auditors read; foreign and unknown are both 404 ``not_found``. Handlers are thin: reads from
``admission.selectors``, writes through ``admission.services``.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse
from ninja import Router
from ninja.decorators import decorate_view

from admission import selectors, services
from admission.schemas import (
    POLICY_BODY_LIMIT,
    PolicyDetailOut,
    PolicyIn,
    PolicyListOut,
    PolicyStatusOut,
)
from queues.access import HumanActor
from queues.auth import HumanAuth
from switchboard.core.http import (
    ErrorOut,
    bounded,
    entity_tag,
    if_match_header,
    if_none_match_header,
    write_preconditions,
)

router = Router(tags=["admission"], auth=HumanAuth())

READ_ERRORS: dict[int, Any] = {401: ErrorOut, 403: ErrorOut}
ONE_ERRORS: dict[int, Any] = {400: ErrorOut, 401: ErrorOut, 403: ErrorOut, 404: ErrorOut}
WRITE_ERRORS: dict[int, Any] = {
    400: ErrorOut,
    401: ErrorOut,
    403: ErrorOut,
    404: ErrorOut,
    409: ErrorOut,
    412: ErrorOut,
    413: ErrorOut,
    429: ErrorOut,
}

IF_MATCH = if_match_header("any budget")
IF_NONE_MATCH = if_none_match_header("create only, where there is no budget yet")


def _actor(request: HttpRequest) -> HumanActor:
    actor: HumanActor = request.auth  # type: ignore[attr-defined]
    return actor


def _policy_bounded(view: Any) -> Any:
    return bounded(view, POLICY_BODY_LIMIT)


@router.get(
    "/admission",
    response={200: PolicyListOut, **READ_ERRORS},
    summary="List budgets",
)
def list_policies(request: HttpRequest) -> dict[str, Any]:
    """Every budget the caller may read (owners: their endpoints'; superusers and auditors:
    all), each with its posture, derived status and usage now."""
    return {"policies": selectors.policies_with_status(_actor(request))}


@router.get(
    "/admission/{scope}/{queue}",
    response={200: PolicyDetailOut, **ONE_ERRORS},
    summary="One budget, its windows and its audit",
)
def get_policy(
    request: HttpRequest, response: HttpResponse, scope: str, queue: str
) -> dict[str, Any]:
    """The budget of one queue identity with its status, the last 30 windows (used, refused,
    limit) and its ledger rows, newest first. Its version is also the ETag."""
    selectors.parse_scope(scope)
    detail = selectors.policy_detail(_actor(request), scope, queue)
    response["ETag"] = entity_tag(detail["policy"]["version"])
    return detail


@router.put(
    "/admission/{scope}/{queue}",
    response={200: PolicyStatusOut, **WRITE_ERRORS},
    summary="Set a budget (full replace)",
)
@decorate_view(_policy_bounded)
def put_policy(
    request: HttpRequest,
    response: HttpResponse,
    scope: str,
    queue: str,
    payload: PolicyIn,
    if_match: str | None = IF_MATCH,
    if_none_match: str | None = IF_NONE_MATCH,
) -> dict[str, Any]:
    """Create or replace the whole budget: limits absent from the body are removed. Audited in
    the ledger in the same transaction; a raised limit rings the queue at once. Limited to
    POLICY_WRITE_RATE_LIMIT per human (1/s, burst 10). With If-Match (the ETag read) it writes
    only over that version; with If-None-Match: * only where there is no budget: else 412."""
    actor = _actor(request)
    selectors.parse_scope(scope)
    expected = write_preconditions(if_match, if_none_match)
    policy = services.policy_set(
        actor=actor, endpoint=scope, queue=queue, expected=expected, **payload.service_kwargs()
    )
    ev = selectors.evaluate_policy(policy)
    out = selectors.policy_status_out(policy, ev)
    response["ETag"] = entity_tag(out["policy"]["version"])
    return out


@router.delete(
    "/admission/{scope}/{queue}",
    response={204: None, **WRITE_ERRORS},
    summary="Clear a budget",
)
@decorate_view(_policy_bounded)
def delete_policy(
    request: HttpRequest, scope: str, queue: str, if_match: str | None = IF_MATCH
) -> HttpResponse:
    """Remove the budget: the queue is admitted as if it never had one. The ledger keeps the
    history, with the removed budget as ``before``. With If-Match, only that version (or, for
    *, any budget): else 412."""
    selectors.parse_scope(scope)
    expected = write_preconditions(if_match, None)
    services.policy_clear(actor=_actor(request), endpoint=scope, queue=queue, expected=expected)
    return HttpResponse(status=204)
