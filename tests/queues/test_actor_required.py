"""Every service is told who acts: one called without an actor, or with None, is a TypeError and
changes nothing (a write nobody answers for would have no ledger row and no access check)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest

from admission import services as admission_services
from queues import pauses, services
from queues.models import Endpoint, HumanToken, Todo
from queues.selectors import Selection
from switchboard.ledger.models import LedgerEntry
from tests.conftest import Personas, push

Call = Callable[[Personas, dict[str, Any]], Any]

SERVICES: dict[str, Call] = {
    "endpoint_vend": lambda p, a: services.endpoint_vend(
        owner=p.owner, name="Nobody's", queues=["inbox"], **a
    ),
    "endpoint_update": lambda p, a: services.endpoint_update(endpoint=p.agent, name="X", **a),
    "endpoint_revoke": lambda p, a: services.endpoint_revoke(endpoint=p.agent, **a),
    "endpoint_rotate_hook_secret": lambda p, a: services.endpoint_rotate_hook_secret(
        endpoint=p.agent, **a
    ),
    "human_token_create": lambda p, a: services.human_token_create(user=p.owner, **a),
    "human_token_revoke": lambda p, a: services.human_token_revoke(
        token=HumanToken.objects.first() or HumanToken(), **a
    ),
    "todo_create": lambda p, a: services.todo_create(
        endpoint=p.agent, queue="inbox", title="t", **a
    ),
    "claim": lambda p, a: services.claim(todo_id=Todo.objects.first().pk, **a),  # type: ignore[union-attr]
    "claim_next": lambda p, a: services.claim_next(**a),
    "heartbeat": lambda p, a: services.heartbeat(todo_id=uuid.uuid4(), **a),
    "complete": lambda p, a: services.complete(todo_id=uuid.uuid4(), **a),
    "fail": lambda p, a: services.fail(todo_id=uuid.uuid4(), **a),
    "release": lambda p, a: services.release(todo_id=uuid.uuid4(), **a),
    "todo_retry": lambda p, a: services.todo_retry(todo_id=uuid.uuid4(), **a),
    "todo_release": lambda p, a: services.todo_release(todo_id=uuid.uuid4(), **a),
    "todo_discard": lambda p, a: services.todo_discard(todo_id=Todo.objects.first().pk, **a),  # type: ignore[union-attr]
    "todos_bulk": lambda p, a: services.todos_bulk(
        action="discard", selection=Selection(), token="x", **a
    ),
    "queue_pause": lambda p, a: pauses.queue_pause(queue="inbox", reason="r", **a),
    "queue_resume": lambda p, a: pauses.queue_resume(queue="inbox", **a),
    "policy_set": lambda p, a: admission_services.policy_set(
        endpoint=p.agent,
        queue="inbox",
        max_in_flight=1,
        max_claims_per_window=None,
        window=None,
        **a,
    ),
    "policy_clear": lambda p, a: admission_services.policy_clear(
        endpoint=p.agent, queue="inbox", **a
    ),
}


def _state() -> tuple[int, int, int, list[str]]:
    return (
        LedgerEntry.objects.count(),
        Todo.objects.count(),
        Endpoint.objects.count(),
        sorted(Endpoint.objects.values_list("state", flat=True)),
    )


@pytest.mark.parametrize("how", ["omitted", "None"])
@pytest.mark.parametrize("name", sorted(SERVICES))
def test_a_service_without_an_actor_is_a_type_error_and_changes_nothing(
    personas: Personas, name: str, how: str
) -> None:
    push(personas, 1)
    before = _state()
    with pytest.raises(TypeError, match="actor"):
        SERVICES[name](personas, {} if how == "omitted" else {"actor": None})
    assert _state() == before
