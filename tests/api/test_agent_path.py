"""The agents' lean path (``switchboard.asgi.AgentPath``: REST verbs, MCP POSTs) answers exactly as
Django's handler does (status, every header in the same order, the body), and leaves every
other request to Django before anything is charged or changed.

Both paths run in this process, on one handler built under each test's settings
(``OneHopHandler(threads=0, agent_threads=0)``: no pool threads; the test's thread serves).
Writes are committed (``tx_personas``): each request returns its connection to the pool at its
end, or keeps it clean for its thread's next request, as the server does."""

from __future__ import annotations

import io
import json
import logging
import time
import uuid
from typing import Any

import pytest
from django.db import connection
from django.http.response import HttpResponseBase
from django.test import Client, override_settings
from psycopg.pq import TransactionStatus

from queues import services
from switchboard import mcp, requestdb
from switchboard.asgi import OneHopHandler, _Answer
from switchboard.core import verbs
from tests.conftest import FIXTURE, Personas, push
from tests.inprocess import agent_scope, idle_in_pool


def _body(value: Any) -> bytes:
    return b"" if value is None else json.dumps(value).encode()


def _lean(handler: OneHopHandler, scope: dict[str, Any], body: bytes) -> _Answer | None:
    spec = handler.agent_path.route(scope)
    assert not isinstance(spec, str)
    if spec is None:
        return None
    return handler.agent_path.serve(scope, body, spec)


def _django(handler: OneHopHandler, scope: dict[str, Any], body: bytes) -> HttpResponseBase:
    return handler._respond(scope, io.BytesIO(body))


def _wire(response: _Answer | HttpResponseBase) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """What goes out: the status, the encoded headers in order, the body."""
    if isinstance(response, _Answer):
        return response.status, response.headers, response.body
    headers = [(k.encode("ascii"), v.encode("latin1")) for k, v in response.items()]
    return response.status_code, headers, response.content  # type: ignore[attr-defined]


def _same(handler: OneHopHandler, verb: str, token: str | None, value: Any, **kw: Any) -> Any:
    """Send the request both ways; the answers must be the same on the wire. Returns the JSON."""
    body = _body(value)
    lean = _lean(handler, agent_scope(verb, token, body, **kw), body)
    assert lean is not None, (verb, value)
    # Given back to the pool at the request's end, or kept clean for the thread's next request
    # (switchboard.requestdb; tests/api/test_request_connection.py).
    assert connection.connection is None or requestdb._clean(connection)
    django = _django(handler, agent_scope(verb, token, body, **kw), body)
    assert _wire(lean) == _wire(django), (verb, value)
    return json.loads(lean.body)


@pytest.fixture
def handler() -> OneHopHandler:
    return OneHopHandler(threads=0, agent_threads=0)


def test_reads_and_refusals_are_the_same_on_the_wire(
    tx_personas: Personas, handler: OneHopHandler
) -> None:
    p = tx_personas
    _, reader = services.endpoint_vend(
        actor=FIXTURE, owner=p.owner, name="Reader", queues=["inbox"], verbs=["list_todos"]
    )
    (theirs,) = push(p, 1, endpoint=p.foreign)
    token = p.agent_token
    assert _same(handler, "claim_next", token, {}) == {"empty": True}
    assert _same(handler, "claim_next", token, None) == {"empty": True}  # empty body: defaults
    cases: list[tuple[str, str | None, Any, int]] = [
        ("get_todo", token, {"id": str(uuid.uuid4())}, 404),
        ("complete", token, {"id": str(theirs.id)}, 404),  # another endpoint's todo
        ("claim_next", token, {"queue": "elsewhere"}, 403),  # outside the scope
        ("claim_next", reader, {}, 403),  # outside the grant
        ("list_todos", "sbk_not-a-token", {}, 401),  # unknown: WWW-Authenticate
        ("list_todos", "not-even-a-prefix", {}, 401),
    ]
    for verb, secret, value, status in cases:
        answer = _same(handler, verb, secret, value)
        assert answer["code"], (verb, status)
    (todo,) = push(p, 1)
    claimed = _lean(handler, *_pair("claim_next", token, {"lease_ttl_seconds": 60}))
    assert claimed is not None and claimed.status == 200
    assert json.loads(claimed.body)["todo"]["id"] == str(todo.id)
    got = _same(handler, "get_todo", token, {"id": str(todo.id)})
    assert got["todo"]["state"] == "claimed"
    listed = _same(handler, "list_todos", token, {})
    assert [t["id"] for t in listed["todos"]] == [str(todo.id)]


def test_every_surface_reads_a_bearer_header_alike(
    tx_personas: Personas, handler: OneHopHandler
) -> None:
    """The scheme in any case, one or more spaces after it, white space around the token: the
    agents' REST path refused ``Bearer  sbk_…`` (two spaces) that MCP, the operator API and
    /metrics took. Each surface here, each header both ways it can be served."""
    p = tx_personas
    human = services.human_token_create(actor=FIXTURE, user=p.owner, name="t")[1]
    mcp_call = json.dumps(
        {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": META}}
    )
    mcp_headers = {
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": MODERN,
        "Mcp-Method": "tools/list",
    }
    client = Client()

    def answers(header: str, token: str) -> list[int]:
        spelt = header.format(token)
        wire = [(b"authorization", spelt.encode())]
        lean = _lean(handler, *_pair("list_todos", None, {}, extra=wire))
        django = _django(handler, *_pair("list_todos", None, {}, extra=wire))
        auth = {"Authorization": spelt}
        human_spelt = {"Authorization": header.format(human)}
        metrics = {"Authorization": header.format("test-metrics-token")}
        return [
            lean.status if lean is not None else django.status_code,
            django.status_code,
            client.head("/api/v1/agent/events", headers=auth).status_code,
            client.post(
                "/mcp/agent",
                mcp_call,
                content_type="application/json",
                headers={**auth, **mcp_headers},
            ).status_code,
            client.get("/api/v1/todos", headers=human_spelt).status_code,
            client.get("/metrics", headers=metrics).status_code,
        ]

    for header in ["Bearer {}", "bearer {}", "BEARER  {}", "Bearer {}  ", "Bearer \t{} "]:
        assert answers(header, p.agent_token) == [200] * 6, header
    for header in ["Bearer", "Bearer  ", "Basic {}", "Bearer{}", "Bearer {}x"]:
        assert 200 not in answers(header, p.agent_token), header


def _pair(verb: str, token: str | None, value: Any, **kw: Any) -> tuple[dict[str, Any], bytes]:
    body = _body(value)
    return agent_scope(verb, token, body, **kw), body


def test_a_claim_and_its_completion_answer_as_djangos(
    tx_personas: Personas, handler: OneHopHandler
) -> None:
    """Two todos: one claimed and completed each way; the answers differ only in the todo."""
    p = tx_personas
    push(p, 2)
    answers = []
    for serve in (_lean, _django):
        claimed = _wire(serve(handler, *_pair("claim_next", p.agent_token, {})))  # type: ignore[arg-type]
        todo = json.loads(claimed[2])["todo"]
        done = _wire(serve(handler, *_pair("complete", p.agent_token, {"id": todo["id"]})))  # type: ignore[arg-type]
        assert json.loads(done[2])["todo"]["state"] == "done"
        answers.append((claimed, done))
    for lean, django in zip(*answers, strict=True):
        assert lean[0] == django[0] == 200
        assert [h for h in lean[1] if h[0] != b"Content-Length"] == [
            h for h in django[1] if h[0] != b"Content-Length"
        ]
        assert [h[0] for h in lean[1]] == [h[0] for h in django[1]]
        assert dict(lean[1])[b"Content-Length"] == str(len(lean[2])).encode()
        assert _shape(json.loads(lean[2])) == _shape(json.loads(django[2]))


def _shape(value: Any) -> Any:
    """The keys of a JSON value, recursively (values differ between two todos)."""
    if isinstance(value, dict):
        return {k: _shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_shape(v) for v in value]
    return type(value).__name__


def test_the_rate_limit_and_the_deadline_answer_as_djangos(
    tx_personas: Personas, handler: OneHopHandler
) -> None:
    p = tx_personas
    _, slow = services.endpoint_vend(
        actor=FIXTURE, owner=p.owner, name="Slow", queues=["inbox"], rps=0.01, burst=1
    )
    assert _lean(handler, *_pair("claim_next", slow, {})) is not None  # the one request
    refused = _same(handler, "claim_next", slow, {})  # 429 both ways, Retry-After included
    assert refused["code"] == "rate_limited"
    push(p, 1)
    late = time.monotonic() - 3600  # queued for an hour: nothing may start
    refused = _same(handler, "claim_next", p.agent_token, {}, arrived=late)
    assert refused["code"] == "unavailable"
    claimed = _lean(handler, *_pair("claim_next", p.agent_token, {}))
    assert claimed is not None and json.loads(claimed.body)["empty"] is False  # not claimed before


def test_anything_else_is_left_to_django_before_anything_is_charged(
    tx_personas: Personas, handler: OneHopHandler
) -> None:
    """A request the lean path declines is answered by Django's path as before; with a rate
    of one request, the declined ones must not have used it."""
    p = tx_personas
    _, once = services.endpoint_vend(
        actor=FIXTURE, owner=p.owner, name="Once", queues=["inbox"], rps=0.01, burst=1
    )
    declined: list[tuple[dict[str, Any], bytes]] = [
        _pair("claim_next", once, {}, query=b"queue=inbox"),
        _pair("claim_next", once, {}, content_type=b"text/plain"),
        _pair("claim_next", once, {}, host=b"evil.example"),
        _pair("claim_next", None, {}),
        _pair("claim_next", once, {"bogus": 1}),  # the input model refuses it
        _pair("claim_next", once, {"queue": "in\x00box"}),  # the edge check refuses it
        (agent_scope("claim_next", once, b"{not json"), b"{not json"),
    ]
    for scope, body in declined:
        assert _lean(handler, scope, body) is None, scope
    # A header named with "_" is dropped, as Django drops it: served, and the one request
    # is still there to use.
    scope, body = _pair("claim_next", once, {}, extra=[(b"x_forwarded_proto", b"https")])
    assert _wire(_lean(handler, scope, body))[0] == 200  # type: ignore[arg-type]
    assert _same(handler, "claim_next", once, {})["code"] == "rate_limited"
    # Django's path answers the declined ones: a bad host before the token is read, then the
    # token and its rate before the body.
    statuses = [_django(handler, s, b).status_code for s, b in declined]
    assert statuses == [429, 429, 400, 401, 429, 429, 429]  # the rate is charged first
    # Two Authorization headers are joined, as Django joins them: unknown, both ways.
    joined = [(b"authorization", b"Bearer x")]
    assert _same(handler, "claim_next", once, {}, extra=joined)["code"] == "unauthorized"


@override_settings(
    SECURE_HSTS_SECONDS=3600,
    SECURE_HSTS_INCLUDE_SUBDOMAINS=True,
    SECURE_PROXY_SSL_HEADER=("HTTP_X_FORWARDED_PROTO", "https"),
    SECURE_SSL_REDIRECT=True,
    X_FRAME_OPTIONS="sameorigin",
)
def test_tls_settings_answer_as_djangos(tx_personas: Personas) -> None:
    # The middleware read their settings when built.
    handler = OneHopHandler(threads=0, agent_threads=0)
    token = tx_personas.agent_token
    https = [(b"x-forwarded-proto", b"https")]
    answer = _same(handler, "claim_next", token, {}, extra=https)  # HSTS, SAMEORIGIN
    assert answer == {"empty": True}
    lean = _lean(handler, *_pair("claim_next", token, {}, extra=https))
    headers = dict(_wire(lean)[1])  # type: ignore[arg-type]
    assert headers[b"Strict-Transport-Security"] == b"max-age=3600; includeSubDomains"
    assert headers[b"X-Frame-Options"] == b"SAMEORIGIN"
    # Plain HTTP is redirected by Django's path; the lean path leaves it there.
    assert _lean(handler, *_pair("claim_next", token, {})) is None
    redirected = _django(handler, *_pair("claim_next", token, {}))
    assert redirected.status_code == 301


def test_an_mcp_body_past_djangos_bound_answers_as_djangos(
    tx_personas: Personas, handler: OneHopHandler
) -> None:
    """A body within the MCP bound but over DATA_UPLOAD_MAX_MEMORY_SIZE: Django refuses to read
    it (413), and the lean path too."""
    p = tx_personas
    with override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=64):
        status, answer = _mcp_same(handler, p.agent.slug, p.agent_token, _tool("claim_next", {}))
    assert status == 413 and answer["error"]["data"]["field"] == "body"


@override_settings(AGENT_FAST_PATH=False)
def test_the_setting_turns_the_lean_path_off(tx_personas: Personas) -> None:
    handler = OneHopHandler(threads=0, agent_threads=0)
    assert (
        handler.agent_path.route(agent_scope("claim_next", tx_personas.agent_token, b"{}")) is None
    )


def test_a_refusal_is_logged_as_django_logs_it(
    tx_personas: Personas, handler: OneHopHandler, caplog: pytest.LogCaptureFixture
) -> None:
    records = []
    for serve in (_lean, _django):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="django.request"):
            unknown = {"id": str(uuid.uuid4())}
            serve(handler, *_pair("get_todo", tx_personas.agent_token, unknown))
        records.append([(r.name, r.levelname, r.getMessage()) for r in caplog.records])
    assert (
        records[0]
        == records[1]
        == [("django.request", "WARNING", "Not Found: /api/v1/agent/get_todo")]
    )


def test_every_verb_path_is_served_while_it_resolves_to_its_verb(handler: OneHopHandler) -> None:
    for name in verbs.load_verbs():
        scope = agent_scope(name, "sbk_x", b"{}")
        assert handler.agent_path.route(scope) is verbs.get(name), name
    assert handler.agent_path.route(agent_scope("nope", "sbk_x", b"{}")) is None
    events = agent_scope("claim_next", "sbk_x", b"{}") | {"path": "/api/v1/agent/events"}
    assert handler.agent_path.route(events) is None


# --- MCP: POSTs to /mcp/<slug> go to mcp_view without the middleware chain ----------------------

MODERN = "2026-07-28"
META = {
    "io.modelcontextprotocol/protocolVersion": MODERN,
    "io.modelcontextprotocol/clientCapabilities": {},
}


def _mcp_scope(
    slug: str, token: str | None, message: Any, headers: dict[bytes, bytes] | None = None, **kw: Any
) -> tuple[dict[str, Any], bytes]:
    body = message if isinstance(message, bytes) else json.dumps(message).encode()
    sent = {
        b"accept": b"application/json, text/event-stream",
        b"mcp-protocol-version": b"2026-07-28",
    }
    if isinstance(message, dict) and message.get("method"):
        sent[b"mcp-method"] = message["method"].encode()
        if message["method"] == "tools/call":
            sent[b"mcp-name"] = message["params"]["name"].encode()
    sent.update(headers or {})
    if b"content-type" in sent:
        kw["content_type"] = sent.pop(b"content-type")
    extra = [(k, v) for k, v in sent.items() if v]
    return agent_scope("", token, body, path=f"/mcp/{slug}", extra=extra, **kw), body


def _tool(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    params = {"name": name, "arguments": arguments, "_meta": META}
    return {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": params}


def _mcp_lean(handler: OneHopHandler, scope: dict[str, Any], body: bytes) -> Any:
    slug = handler.agent_path.route(scope)
    if not isinstance(slug, str):
        return None
    return handler.agent_path.serve_mcp(scope, body, slug)


def _mcp_same(handler: OneHopHandler, slug: str, token: str | None, message: Any, **kw: Any) -> Any:
    lean = _mcp_lean(handler, *_mcp_scope(slug, token, message, **kw))
    assert isinstance(lean, _Answer), message
    # Given back to the pool at the request's end, or kept clean for the thread's next request
    # (switchboard.requestdb; tests/api/test_request_connection.py).
    assert connection.connection is None or requestdb._clean(connection)
    django = _django(handler, *_mcp_scope(slug, token, message, **kw))
    assert _wire(lean) == _wire(django), message
    return lean.status, json.loads(lean.body) if lean.body else None


@override_settings(
    SECURE_HSTS_SECONDS=3600, SECURE_PROXY_SSL_HEADER=("HTTP_X_FORWARDED_PROTO", "https")
)
def test_mcp_replies_headers_follow_each_request_on_one_handler(tx_personas: Personas) -> None:
    """A reply's headers are made once per kind of answer and kept (``_plain_headers``): one
    handler answering HTTPS and plain HTTP, a result and an empty 202, gives each the headers
    Django's path gives it (HSTS only over HTTPS)."""
    # The middleware read their settings when built.
    handler = OneHopHandler(threads=0, agent_threads=0)
    p = tx_personas
    https = {b"x-forwarded-proto": b"https"}
    notice = {"jsonrpc": "2.0", "method": "notifications/progress", "params": {"_meta": META}}
    for headers in (https, {}, https, {}):
        for message in (_tool("claim_next", {}), notice):
            status, _ = _mcp_same(handler, p.agent.slug, p.agent_token, message, headers=headers)
            assert status == (200 if "id" in message else 202)
        lean = _mcp_lean(handler, *_mcp_scope(p.agent.slug, p.agent_token, notice, headers=headers))
        assert (b"Strict-Transport-Security" in dict(lean.headers)) is (headers == https)


def test_an_mcp_tool_call_keeps_the_threads_clean_connection(
    tx_personas: Personas, handler: OneHopHandler
) -> None:
    """MCP's lean POSTs keep the thread's clean connection for its next request, as REST's do
    (tests/api/test_request_connection.py); a refusal, answered through Django's response,
    gives the connection back (the response's close sends request_finished)."""
    p = tx_personas
    push(p, 2)
    connection.close()
    kept = None
    for _ in range(2):
        answer = _mcp_lean(
            handler, *_mcp_scope(p.agent.slug, p.agent_token, _tool("claim_next", {}))
        )
        assert isinstance(answer, _Answer) and answer.status == 200
        assert connection.connection is not None
        assert kept is None or connection.connection is kept  # no putconn, getconn, connect
        kept = connection.connection
        assert kept.info.transaction_status == TransactionStatus.IDLE
        assert not idle_in_pool(kept)  # kept by this thread, not given back
    # Another endpoint's token: 403, made and closed as Django's response (request_finished).
    refused = _mcp_lean(
        handler, *_mcp_scope(p.agent.slug, p.foreign_token, _tool("claim_next", {}))
    )
    assert isinstance(refused, _Answer) and refused.status == 403
    assert connection.connection is None
    assert kept is not None and idle_in_pool(kept)  # given back


def test_mcp_posts_are_the_same_on_the_wire(tx_personas: Personas, handler: OneHopHandler) -> None:
    p = tx_personas
    slug, token = p.agent.slug, p.agent_token
    status, answer = _mcp_same(handler, slug, token, _tool("claim_next", {}))
    assert status == 200 and answer["result"]["structuredContent"] == {"empty": True}
    listed = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": META}}
    status, answer = _mcp_same(handler, slug, token, listed)
    assert status == 200 and answer["result"]["tools"]
    cases: list[tuple[str, str | None, Any, dict[bytes, bytes], int]] = [
        (slug, token, _tool("get_todo", {"id": str(uuid.uuid4())}), {}, 200),  # isError result
        (slug, token, _tool("claim_next", {"queue": "elsewhere"}), {}, 200),
        (slug, None, _tool("claim_next", {}), {}, 401),  # WWW-Authenticate
        (slug, "sbk_nope", _tool("claim_next", {}), {}, 401),
        (p.foreign.slug, token, _tool("claim_next", {}), {}, 403),  # another endpoint's URL
        (slug, token, _tool("claim_next", {}), {b"accept": b"text/html"}, 406),
        (slug, token, _tool("claim_next", {}), {b"content-type": b"text/plain"}, 415),
        (slug, token, _tool("claim_next", {}), {b"origin": b"http://evil.example"}, 403),
        (slug, token, _tool("claim_next", {}), {b"origin": b"http://127.0.0.1:8000"}, 200),
        (slug, token, b"[" + b" " * (1 << 20) + b"]", {}, 413),  # read as Django reads it
        (slug, token, b"{not json", {}, 400),
        ("no-such-endpoint", token, _tool("claim_next", {}), {}, 403),
        ("in\x00valid", token, _tool("claim_next", {}), {}, 400),  # the edge check of the path
    ]
    for where, secret, message, headers, expected in cases:
        status, _ = _mcp_same(handler, where, secret, message, headers=headers)
        assert status == expected, (where, message, headers)
    (todo,) = push(p, 1)
    claimed = _mcp_lean(handler, *_mcp_scope(slug, token, _tool("claim_next", {})))
    assert json.loads(claimed.body)["result"]["structuredContent"]["todo"]["id"] == str(todo.id)
    status, answer = _mcp_same(handler, slug, token, _tool("get_todo", {"id": str(todo.id)}))
    assert answer["result"]["structuredContent"]["todo"]["state"] == "claimed"


def test_mcp_rate_and_handshake_answer_as_djangos(
    tx_personas: Personas, handler: OneHopHandler
) -> None:
    p = tx_personas
    slow, secret = services.endpoint_vend(
        actor=FIXTURE, owner=p.owner, name="Slow", queues=["inbox"], rps=0.01, burst=1
    )
    lean = _mcp_lean(handler, *_mcp_scope(slow.slug, secret, _tool("claim_next", {})))
    assert lean.status == 200  # the one tool call
    status, answer = _mcp_same(handler, slow.slug, secret, _tool("claim_next", {}))
    assert status == 429 and answer["error"]["data"]["code"] == "rate_limited"
    # The 2025 handshake: a session is made each way, so the answers differ only in its id.
    hello = {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"},
        },
    }
    old = {b"mcp-protocol-version": b"", b"mcp-method": b""}
    answers = []
    for serve in (_mcp_lean, _django):
        scope, body = _mcp_scope(p.agent.slug, p.agent_token, hello, headers=old)
        answers.append(_wire(serve(handler, scope, body)))
    (lean_status, lean_headers, lean_body), (dj_status, dj_headers, dj_body) = answers
    assert lean_status == dj_status == 200
    assert [h[0] for h in lean_headers] == [h[0] for h in dj_headers]
    assert b"Mcp-Session-Id" in dict(lean_headers)
    assert json.loads(lean_body) == json.loads(dj_body)


def test_mcp_forms_and_queries_take_djangos_path_and_a_stream_answers_the_same(
    tx_personas: Personas, handler: OneHopHandler
) -> None:
    p = tx_personas
    form = {b"content-type": b"application/x-www-form-urlencoded"}
    assert _mcp_lean(handler, *_mcp_scope(p.agent.slug, p.agent_token, {}, headers=form)) is None
    query = _mcp_scope(p.agent.slug, p.agent_token, _tool("claim_next", {}), query=b"a=b")
    assert handler.agent_path.route(query[0]) is None
    for _ in range(2):  # the second time from what the path kept
        other = _mcp_scope(p.agent.slug, p.agent_token, {})[0] | {"path": "/mcp/a/b"}
        assert handler.agent_path.route(other) is None
        slug = handler.agent_path.route(_mcp_scope(p.agent.slug, p.agent_token, {})[0])
        assert slug == p.agent.slug
    # A subscriptions/listen POST answers with a stream: the same headers both ways, and the
    # body sent by the handler's streaming (an asynchronous iterator, not started here).
    listen = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "subscriptions/listen",
        "params": {"notifications": {"resourceSubscriptions": [mcp.TODO_URI]}, "_meta": META},
    }
    streams = []
    for serve in (_mcp_lean, _django):
        response = serve(handler, *_mcp_scope(p.agent.slug, p.agent_token, listen))
        assert isinstance(response, HttpResponseBase) and response.streaming
        streams.append((response.status_code, list(response.items())))
        response.close()
    assert streams[0] == streams[1]
    assert dict(streams[0][1])["Content-Type"].startswith("text/event-stream")
