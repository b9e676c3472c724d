"""``GET /api/v1/agent/events``: the doorbell as server-sent events, for agents without MCP.

Each ring is one event: ``id`` (resume point), ``event: todo_ready`` and ``data`` naming the todo,
queue and reason. On connect the stream rings for up to three waiting claimable todos; with
``Last-Event-ID`` only for those that changed since that event, so a reconnecting agent is not
told again what it was told; when none did but work waits, once, for the oldest (``waiting``: it
may never have been told of it, or left before draining). A comment every ``KEEPALIVE_SECONDS`` keeps proxies from closing an
idle stream. Authentication is the agent's bearer token, as on every agent route; opening a
stream is charged to the endpoint's request rate once.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, Callable

from django.db import connection
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.http.response import HttpResponseBase
from django.views.decorators.csrf import csrf_exempt

from queues.auth import authenticate_agent
from queues.doorbell import END, Ring, doorbell, since_event
from switchboard.core.errors import DomainError, MethodNotAllowed, Unauthorized
from switchboard.core.http import error_response, unknown_parameter
from switchboard.core.tokens import bearer_token

KEEPALIVE_SECONDS = 15.0
KEEPALIVE = ": keepalive\n\n"
RETRY_MS = 1000


def sse(ring: Ring) -> str:
    return f"id: {ring.id}\nevent: todo_ready\ndata: {json.dumps(ring.as_dict())}\n\n"


# The last words of a stream whose endpoint was revoked (a comment: the agent's reconnect is
# refused with 401, which tells it why).
REVOKED = ": revoked\n\n"


async def ring_stream(
    endpoint_id: str,
    last_event_id: str | None,
    render: Callable[[Ring], str] = sse,
    revoked: str = REVOKED,
) -> AsyncGenerator[str, None]:
    """The rings of one endpoint as SSE text, each event rendered by ``render`` (the MCP stream
    renders JSON-RPC notifications), with keepalive comments between. A revoke of the endpoint
    ends it (with ``revoked``): the token is refused from then on, and so is what it listened to."""
    bell = doorbell()
    sub = await bell.attach(endpoint_id, since_event(last_event_id))
    try:
        yield f"retry: {RETRY_MS}\n: attached\n\n"
        while True:
            try:
                ring = await asyncio.wait_for(sub.rings.get(), KEEPALIVE_SECONDS)
            except TimeoutError:
                yield KEEPALIVE
                continue
            if ring is END:
                yield revoked
                return
            yield render(ring)
    finally:
        bell.detach(sub)


def release_connection() -> None:
    """Give back this request's database connection before streaming: Django closes it only
    when the response ends, so every open stream would hold one and a few dozen idle agents
    would exhaust PostgreSQL's connections. The stream itself needs none (the doorbell holds the
    one LISTEN connection)."""
    connection.close()


@csrf_exempt
def agent_events(request: HttpRequest) -> HttpResponseBase:
    """The stream, under the API's conventions though not a ninja route: HEAD answers its head
    (after the credentials, opening nothing), another method is 405 as the error object, a query parameter (it takes none) is refused after the credentials,
    and no answer is kept by a cache."""
    if request.method not in ("GET", "HEAD"):
        refusal: DomainError = MethodNotAllowed(
            f"{request.method} is not a method of this path; it takes GET, HEAD",
            method=request.method,
            allowed=["GET", "HEAD"],
        )
        answer = _refused(request, refusal)
        answer["Allow"] = "GET, HEAD"
        return answer
    token = bearer_token(request.headers.get("Authorization", ""))
    try:
        if token is None:
            raise Unauthorized("a bearer token is required")
        actor = authenticate_agent(request, token, via="api")
        for name in request.GET:
            raise unknown_parameter(name, "none")
    except DomainError as exc:
        return _refused(request, exc)
    if request.method == "HEAD":  # the stream's head, without opening it (RFC 9110 9.3.2)
        head = HttpResponse(content_type="text/event-stream")
        head["Cache-Control"] = "no-store"
        return head
    release_connection()
    response = StreamingHttpResponse(
        ring_stream(str(actor.endpoint.id), request.headers.get("Last-Event-ID")),
        content_type="text/event-stream",
    )
    response["Cache-Control"] = "no-store"
    response["X-Accel-Buffering"] = "no"
    return response


def _refused(request: HttpRequest, exc: DomainError) -> HttpResponseBase:
    answer = error_response(request, exc)
    answer["Cache-Control"] = "no-store"
    return answer
