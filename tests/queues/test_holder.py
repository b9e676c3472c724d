"""The holder is the holder: a superseded attempt changes nothing, with or without a fence, and
a lapsed lease is refused alike by every verb."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.test import Client

from queues import services
from queues.models import Todo
from switchboard.core.errors import Conflict
from tests.api.conftest import Api
from tests.conftest import Personas, lapse, push

Verb = Callable[..., Any]


def _heartbeat(**kw: Any) -> Any:
    return services.heartbeat(**kw)


def _complete(**kw: Any) -> Any:
    return services.complete(result={"by": "old holder"}, **kw)


def _fail(**kw: Any) -> Any:
    return services.fail(error="old holder", **kw)


def _release(**kw: Any) -> Any:
    return services.release(**kw)


VERBS = [_heartbeat, _complete, _fail, _release]


def refusal(call: Verb, **kw: Any) -> dict[str, Any]:
    with pytest.raises(Conflict) as caught:
        call(**kw)
    return caught.value.as_dict()


@pytest.mark.parametrize("verb", VERBS, ids=lambda v: v.__name__.strip("_"))
@pytest.mark.parametrize("fenced", [False, True], ids=["unfenced", "fenced"])
def test_a_superseded_attempt_is_refused_and_changes_nothing(
    personas: Personas, verb: Verb, fenced: bool
) -> None:
    todo = push(personas)[0]
    agent = personas.as_agent()
    first = services.claim(actor=agent, todo_id=todo.id, require_fence=fenced, claimant="a")
    lapse(todo)
    second = services.claim(actor=agent, todo_id=todo.id, claimant="b")
    assert (first.attempt, second.attempt) == (1, 2)
    before = Todo.objects.get(pk=todo.pk)

    body = refusal(
        verb, actor=agent, todo_id=todo.id, attempt=first.attempt, lease_token=first.lease_token
    )

    assert (body["code"], body["reason"], body["attempt"]) == ("conflict", "superseded", 2)
    after = Todo.objects.get(pk=todo.pk)
    assert (after.state, after.owner, after.lease_expires_at, after.result) == (
        before.state,
        "b",
        before.lease_expires_at,
        before.result,
    )
    done = services.complete(actor=agent, todo_id=todo.id, attempt=second.attempt)
    assert done.state == "done"


def test_a_fenced_holder_cannot_act_on_an_unfenced_successor(personas: Personas) -> None:
    todo = push(personas)[0]
    agent = personas.as_agent()
    first = services.claim(actor=agent, todo_id=todo.id, require_fence=True)
    lapse(todo)
    services.claim(actor=agent, todo_id=todo.id)
    body = refusal(_heartbeat, actor=agent, todo_id=todo.id, lease_token=first.lease_token)
    assert body["reason"] == "superseded"


@pytest.mark.parametrize("verb", VERBS, ids=lambda v: v.__name__.strip("_"))
def test_a_fence_naming_no_claim_of_the_todo_is_a_mismatch_not_a_takeover(
    personas: Personas, verb: Verb
) -> None:
    """Nothing took the work over: a holder told "superseded" gives up work it still holds."""
    todo = push(personas)[0]
    agent = personas.as_agent()
    fenced = services.claim(actor=agent, todo_id=todo.id, require_fence=True)
    cases: list[tuple[dict[str, Any], str]] = [
        ({"attempt": 2, "lease_token": fenced.lease_token}, "attempt 2 has not been made"),
        ({"lease_token": "sbl_never-given"}, "the lease token is not this claim's"),
        ({"attempt": 1}, "present its lease_token"),
    ]
    for kwargs, words in cases:
        body = refusal(verb, actor=agent, todo_id=todo.id, **kwargs)
        assert (body["reason"], body["attempt"]) == ("fence_mismatch", 1), kwargs
        assert words in body["error"], body
    services.release(actor=agent, todo_id=todo.id, lease_token=fenced.lease_token)
    unfenced = services.claim(actor=agent, todo_id=todo.id)
    body = refusal(verb, actor=agent, todo_id=todo.id, lease_token="sbl_never-given")
    assert body["reason"] == "fence_mismatch" and "without require_fence" in body["error"]
    body = refusal(verb, actor=agent, todo_id=todo.id, attempt=unfenced.attempt + 5)
    assert body["reason"] == "fence_mismatch"
    after = Todo.objects.get(pk=todo.pk)
    assert (after.state, after.attempt, after.result) == ("claimed", unfenced.attempt, None)


@pytest.mark.parametrize("verb", VERBS, ids=lambda v: v.__name__.strip("_"))
def test_a_bare_call_to_a_fenced_claim_after_a_takeover_names_the_attempt(
    personas: Personas, verb: Verb
) -> None:
    # A's unfenced claim lapsed and B took it over with a fence; A's call naming neither its
    # attempt nor a token was told only to present the token, which tells a holder to keep
    # working (README: "nothing took the work over").
    todo = push(personas)[0]
    agent = personas.as_agent()
    services.claim(actor=agent, todo_id=todo.id, claimant="agent-a")
    lapse(todo)
    services.claim(actor=agent, todo_id=todo.id, require_fence=True, claimant="agent-b")
    body = refusal(verb, actor=agent, todo_id=todo.id)
    assert (body["reason"], body["attempt"]) == ("fence_mismatch", 2)
    assert "it is attempt 2: a holder of an earlier attempt was superseded" in body["error"]
    assert refusal(verb, actor=agent, todo_id=todo.id, attempt=1)["reason"] == "superseded"
    after = Todo.objects.get(pk=todo.pk)
    assert (after.state, after.attempt, after.owner) == ("claimed", 2, "agent-b")


@pytest.mark.parametrize("verb", VERBS, ids=lambda v: v.__name__.strip("_"))
@pytest.mark.parametrize("fenced", [False, True], ids=["unfenced", "fenced"])
def test_a_lapsed_lease_is_refused_alike_by_every_verb(
    personas: Personas, verb: Verb, fenced: bool
) -> None:
    todo = push(personas)[0]
    agent = personas.as_agent()
    held = services.claim(actor=agent, todo_id=todo.id, require_fence=fenced)
    lapse(todo)
    body = refusal(verb, actor=agent, todo_id=todo.id, lease_token=held.lease_token)
    assert (body["reason"], body["attempt"]) == ("lease_lapsed", 1)
    assert Todo.objects.get(pk=todo.pk).state == "claimed"


@pytest.mark.parametrize("verb", VERBS, ids=lambda v: v.__name__.strip("_"))
def test_a_claim_an_operator_ended_is_refused_as_not_claimed(
    personas: Personas, verb: Verb
) -> None:
    """An operator released the claim: the holder's ending says so with a reason it can branch
    on (it had none, only the words "todo is pending, not claimed")."""
    todo = push(personas)[0]
    agent = personas.as_agent()
    held = services.claim(actor=agent, todo_id=todo.id)
    services.todo_release(actor=personas.as_human(), todo_id=todo.id, attempt=held.attempt)
    body = refusal(verb, actor=agent, todo_id=todo.id, attempt=held.attempt)
    assert (body["code"], body["reason"], body["state"], body["attempt"]) == (
        "conflict",
        "not_claimed",
        "pending",
        1,
    )
    assert Todo.objects.get(pk=todo.pk).state == "pending"


def test_an_operator_may_still_release_a_lapsed_claim(personas: Personas) -> None:
    todo = push(personas)[0]
    services.claim(actor=personas.as_agent(), todo_id=todo.id, require_fence=True)
    lapse(todo)
    released = services.todo_release(actor=personas.as_human(), todo_id=todo.id)
    assert released.state == "pending"


def test_over_rest_every_claim_names_its_attempt_and_a_stale_one_is_409(
    personas: Personas, client: Client
) -> None:
    agent_api = Api(client, personas.agent_token)
    todo = push(personas)[0]
    claimed = agent_api.verb("claim", {"id": str(todo.id)}).json()
    assert claimed["attempt"] == 1
    lapse(todo)
    again = agent_api.verb("claim_next", {"queue": "inbox"}).json()
    assert again["attempt"] == 2
    stale = agent_api.verb("complete", {"id": str(todo.id), "attempt": 1})
    assert stale.status_code == 409
    assert stale.json()["reason"] == "superseded"
    assert agent_api.verb("complete", {"id": str(todo.id), "attempt": 2}).status_code == 200
