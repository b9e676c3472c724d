"""The agent verbs' direct operation (``switchboard.api.agent_verb_direct``) answers a plain
request exactly as ninja's operation does, and leaves every other request to ninja."""

from __future__ import annotations

import json
import uuid
from typing import Any

from django.http import HttpResponseBase
from django.test import RequestFactory
from django.urls import resolve

from queues import services
from switchboard.api import agent_verb_direct
from switchboard.core import verbs
from tests.conftest import FIXTURE, Personas, push

factory = RequestFactory()


def _request(verb: str, token: str | None, body: Any = None, **kw: Any) -> Any:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    data = "" if body is None else json.dumps(body)
    return factory.post(
        f"/api/v1/agent/{verb}",
        data,
        content_type=kw.get("content_type", "application/json"),
        headers=headers,
        QUERY_STRING=kw.get("query", ""),
    )


def _ninja(verb: str, token: str | None, body: Any = None) -> HttpResponseBase:
    """The same request through ninja's operation (the view the direct one falls back to)."""
    view = resolve(f"/api/v1/agent/{verb}").func.__wrapped__  # type: ignore[attr-defined]
    response: HttpResponseBase = view(_request(verb, token, body))
    return response


def _direct(verb: str, token: str | None, body: Any = None, **kw: Any) -> HttpResponseBase | None:
    spec = verbs.get(verb)
    assert spec is not None
    return agent_verb_direct(_request(verb, token, body, **kw), spec)


def _same(a: HttpResponseBase, b: HttpResponseBase) -> None:
    assert a.status_code == b.status_code
    assert json.loads(a.content) == json.loads(b.content)  # type: ignore[attr-defined]
    for header in ("Content-Type", "WWW-Authenticate", "Retry-After"):
        assert a.get(header) == b.get(header), header


def test_answers_and_refusals_match_ninjas_operation(personas: Personas) -> None:
    _, reader = services.endpoint_vend(
        actor=FIXTURE, owner=personas.owner, name="Reader", queues=["inbox"], verbs=["list_todos"]
    )
    (theirs,) = push(personas, 1, endpoint=personas.foreign)
    token = personas.agent_token
    cases: list[tuple[str, str | None, Any]] = [
        ("claim_next", token, {}),  # nothing to claim: {"empty": true}
        ("claim_next", token, None),  # an empty body is the defaults
        ("get_todo", token, {"id": str(uuid.uuid4())}),  # 404
        ("complete", token, {"id": str(theirs.id)}),  # another endpoint's todo: 404
        ("claim_next", token, {"queue": "elsewhere"}),  # outside the scope: 403
        ("claim_next", reader, {}),  # outside the grant: 403
        ("list_todos", "sbk_not-a-token", {}),  # unknown token: 401
    ]
    for verb, secret, body in cases:
        direct = _direct(verb, secret, body)
        assert direct is not None, (verb, body)
        _same(direct, _ninja(verb, secret, body))
    push(personas, 1)
    claimed = _direct("claim_next", token, {"lease_ttl_seconds": 60})
    assert claimed is not None and claimed.status_code == 200
    todo = json.loads(claimed.content)["todo"]  # type: ignore[attr-defined]
    _same(
        _direct("get_todo", token, {"id": todo["id"]}),  # type: ignore[arg-type]
        _ninja("get_todo", token, {"id": todo["id"]}),
    )


def test_a_revoked_token_is_refused_by_the_direct_operation_too(personas: Personas) -> None:
    services.endpoint_revoke(actor=FIXTURE, endpoint=personas.agent)
    direct = _direct("list_todos", personas.agent_token, {})
    assert direct is not None
    _same(direct, _ninja("list_todos", personas.agent_token, {}))
    assert direct.status_code == 401


def test_anything_but_a_plain_request_is_left_to_ninja(personas: Personas) -> None:
    token = personas.agent_token
    assert _direct("claim_next", None, {}) is None  # no credentials: ninja's 401
    assert _direct("claim_next", token, {}, content_type="text/plain") is None
    assert _direct("claim_next", token, {}, query="queue=inbox") is None
    assert _direct("claim_next", token, {"lease_ttl_seconds": 0}) is None  # invalid: 400
    assert _direct("claim", token, {"id": "not-a-uuid"}) is None
    assert _direct("get_todo", token, [1, 2]) is None
    assert _direct("create_todo", token, {"queue": "inbox", "title": "\u0000"}) is None
