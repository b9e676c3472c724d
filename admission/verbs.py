"""The agent's budget verbs, served as REST routes and MCP tools (switchboard/core/verbs.py).

- ``admission_status {queue?}``: granted with claim or claim_next (``Endpoint.holds``); only the
  caller's scoped queues, an out-of-scope queue is ``forbidden``.
- ``set_admission_policy {queue, policy}`` / ``clear_admission_policy {queue}``: their own
  family, never in the basic grant ("lets the agent change its own budget"). They call the same
  services as the operator API, audited with the acting endpoint and its owner.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from admission import selectors, services
from admission.schemas import (
    AdmissionStatusIn,
    AdmissionStatusOut,
    ClearAdmissionPolicyIn,
    PolicyEnvelopeOut,
    SetAdmissionPolicyIn,
)
from queues.access import AgentActor
from queues.schemas import iso
from switchboard.core import versions
from switchboard.core.errors import InvalidArgument
from switchboard.core.verbs import Hints, verb


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if hasattr(value, "isoformat"):
        return iso(value)
    return value


def _one(actor: AgentActor, queue: str) -> dict[str, Any]:
    return _jsonable(selectors.admission_status(actor, queue)[0])


@verb(
    "admission_status",
    hints=Hints(read_only=True),
    input=AdmissionStatusIn,
    output=AdmissionStatusOut,
    description="The budget of each of this endpoint's queues (or of one): its posture and "
    "limits, whether a claim would be admitted now and, if not, why and until when, and the "
    "usage of the current window.",
)
def admission_status(actor: AgentActor, data: AdmissionStatusIn) -> dict[str, Any]:
    return {"queues": _jsonable(selectors.admission_status(actor, data.queue))}


@verb(
    "set_admission_policy",
    hints=Hints(destructive=True, idempotent=True),
    input=SetAdmissionPolicyIn,
    output=PolicyEnvelopeOut,
    description="Set this endpoint's budget on one of its queues (a full replace): "
    "max_in_flight, max_claims_per_window per window {period, tz, start, weekday}, posture. "
    "With if_version, only over the budget as read. Audited with this endpoint as the actor.",
    errors=(404, 409, 412),
)
def set_admission_policy(actor: AgentActor, data: SetAdmissionPolicyIn) -> dict[str, Any]:
    with _policy_fields():
        services.policy_set(
            actor=actor,
            endpoint=actor.endpoint,
            queue=data.queue,
            expected=versions.named(data.if_version),
            **data.policy.service_kwargs(),
        )
    return _one(actor, data.queue)


# The verb's own arguments; every other field a refusal names is the policy's.
_ARGUMENTS = frozenset({"queue", "if_version"})


@contextmanager
def _policy_fields() -> Iterator[None]:
    """The service names a budget's fields as the operator's body holds them (``window``,
    ``windows[1].period``); this verb holds them under ``policy``, so a refusal names them
    there, as the verb's own schema checks do (``policy.window.weekday``)."""
    try:
        yield
    except InvalidArgument as exc:
        if exc.field in _ARGUMENTS or exc.field.startswith("policy"):
            raise
        field = f"policy.{exc.field}"
        message = exc.message
        if message.startswith(exc.field):
            message = "policy." + message
        details = {k: v for k, v in exc.details.items() if k != "field"}
        raise InvalidArgument(message, field=field, **details) from None


@verb(
    "clear_admission_policy",
    hints=Hints(destructive=True, idempotent=True),
    input=ClearAdmissionPolicyIn,
    output=PolicyEnvelopeOut,
    description="Remove this endpoint's budget on one of its queues. With if_version, only the "
    "budget as read. Audited with this endpoint as the actor.",
    errors=(404, 412),
)
def clear_admission_policy(actor: AgentActor, data: ClearAdmissionPolicyIn) -> dict[str, Any]:
    services.policy_clear(
        actor=actor,
        endpoint=actor.endpoint,
        queue=data.queue,
        expected=versions.named(data.if_version),
    )
    return _one(actor, data.queue)
