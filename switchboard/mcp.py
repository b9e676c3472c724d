"""MCP over Streamable HTTP at ``/mcp/<slug>``: JSON-RPC 2.0, the agent verbs as tools.

Revisions served:

* **2026-07-28** (stateless): each POST is one self-contained request carrying its protocol
  version and client capabilities in ``params._meta``, mirrored in the ``MCP-Protocol-Version``,
  ``Mcp-Method`` (and, for a ``tools/call`` or ``resources/read``, ``Mcp-Name``) headers.
  Methods: ``server/discover``, ``tools/list``, ``tools/call``, ``subscriptions/listen`` (the
  doorbell; see ``_listen``). No
  sessions. A request is routed here when its
  ``MCP-Protocol-Version`` header names a version outside the handshake era (as the SDK's
  server does), and the envelope ladder then checks it: ``-32602`` for a missing envelope key,
  ``-32020`` for a header that disagrees with the body, ``-32022`` (with ``supported``) for an
  unknown version.
* **2025-11-25, 2025-06-18, 2025-03-26, 2024-11-05** (handshake): ``initialize`` negotiates the
  version (the client's if served, else 2025-11-25) and issues an ``Mcp-Session-Id`` kept in
  Redis (sliding TTL) for that endpoint; later requests must carry it (400 without, 404 when
  unknown or ended). A ``MCP-Protocol-Version`` header naming another served handshake
  revision is honoured for that request (the spec refuses only an invalid or unsupported one,
  with 400: a session's request naming a revision outside both eras is that 400, -32022 with
  ``supported``). ``notifications/initialized`` (202), ``ping``, ``tools/list``,
  ``tools/call``; ``DELETE`` ends the session. JSON-RPC batches are accepted only on sessions
  that negotiated 2025-03-26 or 2024-11-05 (later revisions removed them), whatever revision a
  request's header names.

Responses to a POST are ``application/json`` (never SSE), except ``subscriptions/listen``, whose
response is the stream; a POST must accept JSON (406) and send it (415). The server-to-client stream (``GET`` with the handshake's ``Mcp-Session-Id``,
``Accept: text/event-stream``) carries the doorbell (``queues.doorbell``): each time work becomes
claimable for the endpoint, one ``notifications/resources/updated`` whose ``uri`` is the todo
(``switchboard://todos/<id>``) and whose ``_meta["io.switchboard/todo_ready"]`` names the todo,
queue and reason; on opening, up to three rings for todos already waiting. Both official SDKs
open this stream after the handshake and hand the notification to the client. Those URIs are the
server's resources (the ``resources`` capability, in both eras): ``resources/templates/list``
(``switchboard://todos/{id}``), ``resources/list`` (the endpoint's todos, 100 a page, with
list_todos' grant and cursor), ``resources/read`` (get_todo's answer as JSON, with its grant; a
todo not the endpoint's, or a URI not one of ours, is -32602 with the ``uri``, as the official
SDK's server answers), and in the handshake era ``resources/subscribe`` / ``unsubscribe``,
acknowledged: the session's stream carries every todo's updates from the start. Tool results carry
``structuredContent`` (from 2025-06-18) and the same JSON as text. A refusal is a result with
``isError: true`` whose text is the API's error object as JSON, and which has no
``structuredContent``: the spec requires structured content to fit the tool's ``outputSchema``,
and the TypeScript SDK enforces that on error results too, so an error object there would make
the agent's SDK throw instead of showing it the refusal.

Every other answer is a JSON-RPC error object carrying the request's id (``null`` when the body
could not be read). Protocol faults: -32700 malformed JSON, -32600 invalid request, -32601
unknown method, -32602 bad params or unknown tool. Transport refusals keep their HTTP status and
headers and carry the API's error object (``{"error", "code", ...}``) as ``error.data``: 401
unknown or revoked token, 403 a token of another endpoint or a foreign ``Origin``, 413 a body
over 1 MiB, 406/415 wrong media types, 429 over the endpoint's request rate (with
``Retry-After``), 503 ``unavailable`` when PostgreSQL or Redis does not answer (with
``Retry-After``), 405 for a ``GET`` without a session or a method not served
(``method_not_allowed``), 400 a handshake request without ``Mcp-Session-Id`` and 404 one naming
a session that ended or expired (``invalid_argument``, ``not_found``, each naming the header as
``field``). A method that fails unexpectedly is -32603 in its response
(HTTP 200, as the SDKs' servers answer); a failure outside any method is -32603 with HTTP 500.
Never Django's HTML error page.

The endpoint's request rate is charged for ``tools/call``, ``resources/read`` and
``resources/list`` only: the handshake and discovery (``initialize``,
``notifications/initialized``, ``server/discover``, ``ping``, ``tools/list``,
``resources/templates/list``) are free, so an endpoint vended with a low ``--rps`` can still connect. Each ``tools/call`` of a batch
is charged as if sent alone: one over the rate is answered in the batch with a JSON-RPC error
(-32000, the API's ``rate_limited`` object, with ``retry_after``, as ``data``) and not run.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import functools
import json
import logging
import re
import secrets
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit
from uuid import UUID

import redis
from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.http.response import HttpResponseBase
from django.views.decorators.csrf import csrf_exempt

from queues.access import AgentActor
from queues.auth import REVOKED_MESSAGE, authenticate_agent, check_endpoint_rate
from queues.doorbell import Ring
from queues.events import KEEPALIVE, KEEPALIVE_SECONDS, release_connection, ring_stream
from switchboard.core import counters, verbs
from switchboard.core.availability import is_outage, outage
from switchboard.core.errors import (
    DomainError,
    Forbidden,
    InvalidArgument,
    MethodNotAllowed,
    NotFound,
    RateLimited,
    Unauthorized,
)
from switchboard.core.http import (
    API_BODY_LIMIT,
    BodyRequest,
    BodyTooLarge,
    check_body_size,
    media_type,
    retry_after_seconds,
)
from switchboard.core.tokens import bearer_token
from switchboard.core.validation import NotClientJson, json_loads, not_json

log = logging.getLogger(__name__)

MODERN_VERSIONS = ("2026-07-28",)
HANDSHAKE_VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")  # newest first
BATCH_VERSIONS = ("2025-03-26", "2024-11-05")
STRUCTURED_VERSIONS = ("2026-07-28", "2025-11-25", "2025-06-18")
SESSION_TTL_SECONDS = 24 * 3600
SESSION_PREFIX = "switchboard:mcp:session:"
SERVER_INFO = {"name": "switchboard", "title": "Switchboard", "version": "1"}

PROTOCOL_VERSION_KEY = "io.modelcontextprotocol/protocolVersion"
CLIENT_CAPABILITIES_KEY = "io.modelcontextprotocol/clientCapabilities"
CLIENT_INFO_KEY = "io.modelcontextprotocol/clientInfo"
SERVER_INFO_KEY = "io.modelcontextprotocol/serverInfo"

TODO_URI = "switchboard://todos/"
READY_META = "io.switchboard/todo_ready"
# What the server offers: the tools, and the endpoint's todos as resources (listed a page at a
# time, read by URI, subscribed: the doorbell's rings are their updates).
CAPABILITIES = {
    "tools": {"listChanged": False},
    "resources": {"subscribe": True, "listChanged": False},
}
# Methods charged to the endpoint's request rate (see the module docstring).
CHARGED = frozenset({"tools/call", "resources/read", "resources/list"})
TODO_TEMPLATE = {
    "uriTemplate": TODO_URI + "{id}",
    "name": "todo",
    "title": "A todo of this endpoint",
    "description": "The todo as get_todo answers it: state, attempt, lease, payload, result, "
    "and why it waits (admission, explain).",
    "mimeType": "application/json",
}
SUBSCRIPTION_ID_KEY = "io.modelcontextprotocol/subscriptionId"

SERVER_ERROR = -32000  # JSON-RPC's implementation-defined range: a transport refusal
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
HEADER_MISMATCH = -32020
INTERNAL_FAILURE = "Internal error: the server could not answer this request"
UNSUPPORTED_PROTOCOL_VERSION = -32022
# The 2026-07-28 transport maps these JSON-RPC errors to HTTP statuses; everything else is 200.
MODERN_ERROR_STATUS = {
    PARSE_ERROR: 400,
    INVALID_REQUEST: 400,
    INVALID_PARAMS: 400,
    HEADER_MISMATCH: 400,
    UNSUPPORTED_PROTOCOL_VERSION: 400,
    METHOD_NOT_FOUND: 404,
}

Id = str | int | None


class RpcError(Exception):
    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data

    def as_dict(self) -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data is not None:
            error["data"] = self.data
        return error


# --- HTTP ---------------------------------------------------------------------------------------


class Incoming(BodyRequest, Protocol):
    """What the MCP handling reads of a request (``method``, ``body``, ``headers``, read
    case-insensitively, and the host): Django's ``HttpRequest`` has it, and so has
    ``switchboard.asgi``'s lean request for the agents' POSTs (issue 11), which builds no
    HttpRequest."""

    def get_host(self) -> str: ...


@dataclass(slots=True)
class Reply:
    """A whole answer, made without an HttpResponse (issue 11: on the agents' lean path making
    one and reading it back cost more than the JSON-RPC handling): status, content, the
    Content-Type and the other headers in the order an HttpResponse would list them.
    ``as_response`` is its HttpResponse, the same on the wire."""

    status: int
    content: bytes
    content_type: str
    headers: list[tuple[str, str]]


# An empty answer's (202, 204) Content-Type: none, as there is no content to describe (it was
# HttpResponse's default, text/html).
_EMPTY_TYPE = ""


def as_response(answer: Reply | HttpResponseBase) -> HttpResponseBase:
    return _http(answer) if isinstance(answer, Reply) else answer


def _http(reply: Reply) -> HttpResponse:
    response = HttpResponse(reply.content, status=reply.status, content_type=reply.content_type)
    if not reply.content_type:
        del response["Content-Type"]
    for name, value in reply.headers:
        response[name] = value
    return response


def _empty(status: int) -> Reply:
    return Reply(status, b"", _EMPTY_TYPE, [])


# json.dumps(value, separators=(",", ":")), without making an encoder on every call.
_dumps = json.JSONEncoder(separators=(",", ":")).encode


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Reply:
    content = _dumps(body).encode()
    return Reply(status, content, "application/json", list((headers or {}).items()))


def refusal_response(exc: DomainError, id_: Id = None) -> HttpResponse:
    """A transport-level refusal: a JSON-RPC error carrying the API's error object as data."""
    return _http(_refusal(exc, id_))


def _refusal(exc: DomainError, id_: Id = None) -> Reply:
    if exc.code == "invalid_argument":
        code = INVALID_REQUEST
    elif exc.status >= 500:
        code = INTERNAL_ERROR
    else:
        code = SERVER_ERROR
    error = RpcError(code, exc.message, exc.as_dict())
    headers = {}
    seconds = retry_after_seconds(exc)
    if seconds is not None:
        headers["Retry-After"] = str(seconds)
    if exc.status == 401:
        headers["WWW-Authenticate"] = 'Bearer realm="switchboard"'
    body = {"jsonrpc": "2.0", "id": id_, "error": error.as_dict()}
    return _json(body, status=exc.status, headers=headers)


def _transport(
    id_: Id, code: int, exc: DomainError, headers: dict[str, str] | None = None
) -> Reply:
    """A refusal of the transport's (405, a session missing or unknown) with its HTTP status
    and JSON-RPC ``code``, carrying the API's error object as ``data`` as every other does."""
    return _rpc_error(id_, RpcError(code, exc.message, exc.as_dict()), exc.status, headers)


SESSION = "Mcp-Session-Id"


def _no_session() -> NotFound:
    return NotFound("Session not found; it ended or expired: initialize again", field=SESSION)


def _rpc_error(
    id_: Id, error: RpcError, status: int, headers: dict[str, str] | None = None
) -> Reply:
    body = {"jsonrpc": "2.0", "id": id_, "error": error.as_dict()}
    return _json(body, status=status, headers=headers)


def _header(request: Incoming, name: str, default: str | None = None) -> str | None:
    """A header's value without surrounding whitespace, which is not part of it (RFC 9110
    5.5); not every HTTP parser strips it (httptools keeps trailing blanks)."""
    value = request.headers.get(name)
    return value.strip() if value is not None else default


def _accepts_json(request: Incoming) -> bool:
    return _accepts_json_in(request.headers.get("Accept", ""))


# A client sends the same Accept and Content-Type on every request: each value is read once.
@functools.lru_cache(maxsize=64)
def _accepts_json_in(accept: str) -> bool:
    types = [part.split(";")[0].strip().lower() for part in accept.split(",")]
    return any(t in ("application/json", "application/*", "*/*") for t in types)


def _origin_allowed(request: Incoming) -> bool:
    """DNS-rebinding guard: a browser's Origin must be this host or a trusted origin."""
    origin = _header(request, "Origin")
    if not origin:
        return True
    if origin in settings.CSRF_TRUSTED_ORIGINS:
        return True
    return urlsplit(origin).netloc == request.get_host()


@csrf_exempt
def mcp_view(request: HttpRequest, slug: str) -> HttpResponseBase:
    return as_response(respond(request, slug))


def respond(request: Incoming, slug: str) -> Reply | HttpResponseBase:
    """The answer to an MCP request: a ``Reply``, or a response (an event stream)."""
    if request.method not in ("GET", "POST", "DELETE"):
        refused = MethodNotAllowed(
            f"{request.method} is not served here; POST JSON-RPC", method=request.method
        )
        return _transport(None, SERVER_ERROR, refused, headers={"Allow": "GET, POST, DELETE"})
    try:
        try:
            check_body_size(request, API_BODY_LIMIT)
        except RequestDataTooBig:  # a chunked body: Django's own bound tripped first
            raise BodyTooLarge(
                f"the request body is over the limit of {API_BODY_LIMIT} bytes",
                field="body",
                limit=API_BODY_LIMIT,
            ) from None
        if not _origin_allowed(request):
            raise Forbidden("this Origin may not call the MCP endpoint")
        actor = _authenticate(request, slug)
        if request.method == "POST":
            return _post(request, actor)
        version = _header(request, "MCP-Protocol-Version")
        if version is not None and version not in (*HANDSHAKE_VERSIONS, *MODERN_VERSIONS):
            # As a POST of the session's is answered (the transport's 400 for every request
            # after the handshake that names a revision nobody serves).
            return _rpc_error(None, _unsupported(version), 400)
        if request.method == "GET":
            return _get_stream(request, actor)
        return _delete(request, actor)
    except BodyTooLarge as exc:
        return _refusal(exc)  # the id stays unread: reading it means reading the whole body
    except DomainError as exc:
        return _refusal(exc, _body_id(request))
    except Exception as exc:
        if is_outage(exc):  # a dependency did not answer: 503 unavailable, Retry-After
            log.warning("MCP request met an outage", exc_info=True)
            return _refusal(outage(exc), _body_id(request))
        # Whatever broke, the client still reads a JSON-RPC answer to its request.
        log.exception("MCP request failed")
        return _rpc_error(_body_id(request), RpcError(INTERNAL_ERROR, INTERNAL_FAILURE), 500)


def _handler_failed() -> RpcError:
    """A method that failed unexpectedly: -32603 in the response to that request, as the SDKs'
    servers answer (HTTP 200; in a batch the other messages keep their answers)."""
    log.exception("MCP request failed")
    return RpcError(INTERNAL_ERROR, INTERNAL_FAILURE)


def _body_id(request: Incoming) -> Id:
    """The id of the request in the body, when it can be read, for an answer that fails early."""
    try:
        return _request_id(json.loads(request.body))
    except Exception:
        return None


def _authenticate(request: Incoming, slug: str) -> AgentActor:
    token = bearer_token(request.headers.get("Authorization", ""))
    if token is None:
        raise Unauthorized("send Authorization: Bearer sbk_… (the endpoint's token)")
    # The rate is charged per tool call (in _post), not per request: see the module docstring.
    actor = authenticate_agent(None, token, via="mcp", charge_rate=False)
    if actor.endpoint.slug != slug:
        raise Forbidden("this token belongs to another endpoint's MCP URL")
    return actor


def _post(request: Incoming, actor: AgentActor) -> Reply | HttpResponseBase:
    if not _accepts_json(request):
        raise _bad_header(406, "the Accept header must include application/json", "Accept")
    if media_type(request.headers.get("Content-Type", "")) != "application/json":
        raise _bad_header(415, "the body must be Content-Type: application/json", "Content-Type")
    try:
        message = json_loads(request.body)
    except RecursionError:
        return _rpc_error(None, RpcError(PARSE_ERROR, "Parse error: the body is not JSON"), 400)
    except NotClientJson as exc:  # UTF-16 or UTF-32, or a name given twice
        return _rpc_error(None, RpcError(PARSE_ERROR, f"Parse error: the body {exc}"), 400)
    except ValueError as exc:
        error = RpcError(PARSE_ERROR, f"Parse error: the body is not JSON ({not_json(exc)})")
        return _rpc_error(None, error, 400)
    if isinstance(message, dict) and message.get("method") in CHARGED and "id" in message:
        # A request (a notification runs nothing); a batch's calls are charged one by one.
        check_endpoint_rate(actor.endpoint)
    version = _header(request, "MCP-Protocol-Version")
    if version is not None and version not in HANDSHAKE_VERSIONS:
        if version not in MODERN_VERSIONS and _header(request, "Mcp-Session-Id"):
            # A handshake session's request naming a revision nobody serves: the transport's
            # 400 for an unsupported version, not the stateless revision's envelope ladder.
            return _rpc_error(_request_id(message), _unsupported(version), 400)
        return _modern(request, actor, message, version)
    return _legacy(request, actor, message)


def _bad_header(status: int, message: str, field: str) -> DomainError:
    """An invalid_argument refusal with a transport status (406, 415) naming the header."""
    exc = InvalidArgument(message, field=field)
    exc.status = status
    return exc


# --- JSON-RPC envelopes -------------------------------------------------------------------------


@dataclass(slots=True)
class Request:
    id: Id
    method: str
    params: dict[str, Any]
    is_notification: bool


def _valid_id(value: Any) -> bool:
    return isinstance(value, str | int) and not isinstance(value, bool)


def _parse_message(message: Any) -> Request | None:
    """A request or notification; None for a client's response (nothing to answer).

    Raises ``RpcError(INVALID_REQUEST)`` for anything that is not a JSON-RPC 2.0 message.
    """
    if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
        raise RpcError(INVALID_REQUEST, "Invalid Request: not a JSON-RPC 2.0 message")
    if "method" not in message:
        if "id" in message and ("result" in message or "error" in message):
            return None  # a response to a request we never send; accepted and dropped
        raise RpcError(INVALID_REQUEST, "Invalid Request: no method")
    method, params = message["method"], message.get("params", {})
    if not isinstance(method, str):
        raise RpcError(INVALID_REQUEST, "Invalid Request: method must be a string")
    if "id" in message and not _valid_id(message["id"]):
        raise RpcError(INVALID_REQUEST, "Invalid Request: id must be a string or an integer")
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise RpcError(INVALID_REQUEST, "Invalid Request: params must be an object")
    return Request(
        id=message.get("id"), method=method, params=params, is_notification="id" not in message
    )


def _request_id(message: Any) -> Id:
    if isinstance(message, dict) and _valid_id(message.get("id")):
        ident: str | int = message["id"]
        return ident
    return None


# --- tools, shared by both eras -----------------------------------------------------------------


def _tools_list(actor: AgentActor, version: str, params: dict[str, Any]) -> dict[str, Any]:
    # The whole list is one page, so no cursor was ever given out: one sent is not ours
    # (the specification's pagination: an invalid cursor is -32602, not the first page again).
    if params.get("cursor") is not None:
        raise RpcError(
            INVALID_PARAMS, "params.cursor is not one this server gave out: tools/list is one page"
        )
    tools = []
    for spec in verbs.granted(actor):
        tool: dict[str, Any] = {
            "name": spec.name,
            "description": spec.description,
            "inputSchema": spec.input_schema(),
        }
        if version in STRUCTURED_VERSIONS:
            tool["outputSchema"] = spec.output_schema()
        if version != "2024-11-05":  # tool annotations came with 2025-03-26
            tool["annotations"] = spec.hints.annotations()
        tools.append(tool)
    return {"tools": tools}


@dataclass(slots=True)
class ToolResult:
    """A ``tools/call`` result: the answer (or the refusal) as JSON text, its text content, and
    (``structured``) the answer itself as ``structuredContent`` where the revision has it (never
    on a refusal: see the module docstring). ``text`` is the answer as ``_dumps`` writes it, so
    a reply need not encode the answer again (issue 11: encoding it twice more cost more than
    the rest of the JSON-RPC handling of a tool call)."""

    text: str  # as _dumps writes it (_as_dumped)
    is_error: bool
    structured: bool

    def as_dict(self) -> dict[str, Any]:
        result = {"content": [{"type": "text", "text": self.text}], "isError": self.is_error}
        if self.structured:
            result["structuredContent"] = json.loads(self.text)
        return result

    def encoded(self, more: str = "") -> str:
        """``_dumps(self.as_dict())``, with ``more`` (members as JSON, each after a comma) at
        its end: the same bytes, the answer spliced in as its text."""
        # _dumps(self.text): the text is JSON as _dumps writes it (ASCII, compact, every control
        # character and DEL escaped inside its strings), so only its quotes and backslashes
        # need escaping, which str.replace does for a fraction of json's per-character pass.
        text = self.text.replace("\\", "\\\\").replace('"', '\\"')
        parts = ['{"content":[{"type":"text","text":"', text, '"}],"isError":']
        parts.append("true" if self.is_error else "false")
        if self.structured:
            parts += [',"structuredContent":', self.text]
        parts += [more, "}"]
        return "".join(parts)


def _tools_call(actor: AgentActor, params: dict[str, Any], version: str) -> ToolResult:
    name = params.get("name")
    if not isinstance(name, str):
        raise RpcError(INVALID_PARAMS, "tools/call needs params.name, the tool's name")
    arguments = params.get("arguments")
    if arguments is not None and not isinstance(arguments, dict):
        raise RpcError(INVALID_PARAMS, "tools/call params.arguments must be an object")
    spec = verbs.get(name)
    if spec is None:
        raise RpcError(INVALID_PARAMS, f"Unknown tool: {name}")
    try:
        verbs.check_grant(actor, name)
        text = _as_dumped(verbs.call_json(actor, spec, spec.parse(arguments)))
        is_error = False
    except DomainError as exc:
        text = _dumps(exc.as_dict())
        is_error = True
    return ToolResult(text, is_error, version in STRUCTURED_VERSIONS and not is_error)


# A number pydantic writes otherwise than json: a float below 1e-4 in its exponent form
# (``1.5e-7``) or written out (``0.00001``), as a number token begins in compact JSON (after a
# colon, a comma or a bracket, maybe negative). Text may hold the same characters: the answer
# is then written again when it need not be, never the other way round.
_SMALL_FLOAT = re.compile(rb"[:,\[]-?(?:[0-9.]+e-|0\.0000)")


def _as_dumped(content: bytes) -> str:
    """A verb's answer as ``verbs.call_json`` writes it (pydantic's encoder, in one pass from
    the checked model), as ``_dumps`` writes the same answer: MCP's replies keep json's
    spelling. The two write every value alike (ASCII only, compact) but a float below 1e-4
    (json: ``1.5e-07``, ``1e-05``; pydantic: ``1.5e-7``, ``0.00001``) and DEL (json escapes it):
    an answer that may hold one (DEL anywhere, or a number of that form: ``_SMALL_FLOAT``) is
    read back and written by ``_dumps``. Issue 11: encoding the answer's dict with json cost a
    tool call more than this. The cheap looks for ``e-`` and ``0.0000`` go first: a todo id
    holds ``e-`` in about one in four (a hex digit before a hyphen), and its answer need not
    be written again for that."""
    if b"\x7f" in content or (
        (b"e-" in content or b"0.0000" in content) and _SMALL_FLOAT.search(content)
    ):
        return _dumps(json.loads(content))
    return content.decode("ascii")


def _instructions(actor: AgentActor) -> str:
    queues = ", ".join(actor.endpoint.scope_queues)
    return (
        f"Switchboard work queue for endpoint {actor.endpoint.slug} (queues: {queues}). "
        "Call claim_next to take work, heartbeat while you hold it, then complete or fail it. "
        'claim_next answers {"empty": true} when there is nothing to do.'
    )


# --- 2026-07-28: stateless requests ------------------------------------------------------------


def _modern(
    request: Incoming, actor: AgentActor, message: Any, header_version: str
) -> Reply | HttpResponseBase:
    """One self-contained request (see the module docstring for the ladder); ``header_version``
    is its MCP-Protocol-Version header."""
    if isinstance(message, dict) and "id" not in message:
        # A notification: the revision defines none from client to server; acknowledge it.
        try:
            _parse_message(message)
        except RpcError as exc:
            return _rpc_error(None, exc, 400)
        if header_version not in MODERN_VERSIONS:
            return _rpc_error(None, _unsupported(header_version), 400)
        return _empty(202)
    try:
        if isinstance(message, list):
            raise RpcError(
                INVALID_REQUEST, f"JSON-RPC batches are not part of protocol {MODERN_VERSIONS[0]}"
            )
        parsed = _parse_message(message)
        if parsed is None or parsed.is_notification:
            raise RpcError(
                INVALID_REQUEST, "Invalid Request: a single JSON-RPC request is required"
            )
        _check_envelope(request, parsed, header_version)
        if parsed.method == "subscriptions/listen":
            return _listen(request, actor, parsed)
        result = _modern_dispatch(actor, parsed)
    except Exception as exc:
        if isinstance(exc, DomainError) or is_outage(exc):
            raise  # the view answers these with their HTTP status (a refusal, 503)
        error = exc if isinstance(exc, RpcError) else _handler_failed()
        return _rpc_error(_request_id(message), error, MODERN_ERROR_STATUS.get(error.code, 200))
    if isinstance(result, ToolResult):  # as the dict below encodes, the answer encoded once
        ident = str(parsed.id) if type(parsed.id) is int else _dumps(parsed.id)  # as json's
        content = f'{{"jsonrpc":"2.0","id":{ident},"result":'
        content += result.encoded(_MODERN_TAIL) + "}"
        return Reply(200, content.encode(), "application/json", [])
    result.setdefault("resultType", "complete")
    result["_meta"] = {SERVER_INFO_KEY: SERVER_INFO}
    return _json({"jsonrpc": "2.0", "id": parsed.id, "result": result})


def _unsupported(requested: Any) -> RpcError:
    return RpcError(
        UNSUPPORTED_PROTOCOL_VERSION,
        "Unsupported protocol version",
        {"supported": [*MODERN_VERSIONS, *HANDSHAKE_VERSIONS], "requested": requested},
    )


# The methods whose target a 2026-07-28 request repeats in its Mcp-Name header: params' key.
NAME_BEARING = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri"}


def _check_envelope(request: Incoming, req: Request, header_version: str) -> None:
    meta = req.params.get("_meta")
    if not isinstance(meta, dict):
        raise RpcError(
            INVALID_PARAMS,
            f"params._meta must be an object carrying {PROTOCOL_VERSION_KEY!r} and "
            f"{CLIENT_CAPABILITIES_KEY!r}",
        )
    missing = [k for k in (PROTOCOL_VERSION_KEY, CLIENT_CAPABILITIES_KEY) if k not in meta]
    if missing:
        raise RpcError(INVALID_PARAMS, f"params._meta is missing {', '.join(missing)}")
    version = meta[PROTOCOL_VERSION_KEY]
    if header_version != version:
        raise RpcError(
            HEADER_MISMATCH, "the MCP-Protocol-Version header does not match params._meta"
        )
    method = _header(request, "Mcp-Method")
    if method is None:
        raise RpcError(HEADER_MISMATCH, "the Mcp-Method header is missing")
    if method != req.method:
        raise RpcError(HEADER_MISMATCH, "the Mcp-Method header does not match the method")
    # Mcp-Name mirrors the target a request names (2026-07-28, "Standard headers"): a tool's or a
    # prompt's name, a resource's URI. Each is checked, so a proxy routing on the header and this
    # server acting on the body cannot be told two different things.
    key = NAME_BEARING.get(req.method)
    target = req.params.get(key) if key else None
    if target is not None:
        named = _header(request, "Mcp-Name")
        if named is None:
            raise RpcError(
                HEADER_MISMATCH, f"the Mcp-Name header is missing (it gives params.{key})"
            )
        if _header_value(named) != target:
            raise RpcError(HEADER_MISMATCH, f"the Mcp-Name header does not match params.{key}")
    if version not in MODERN_VERSIONS:
        raise _unsupported(version)
    if not isinstance(meta[CLIENT_CAPABILITIES_KEY], dict):
        raise RpcError(
            INVALID_PARAMS, f"params._meta[{CLIENT_CAPABILITIES_KEY!r}] must be an object"
        )


def _header_value(value: str | None) -> str | None:
    """A routing header's value, undoing the ``=?base64?…?=`` wrapping of non-token values."""
    if value and value.startswith("=?base64?") and value.endswith("?="):
        try:
            return base64.b64decode(value[9:-2], validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return None
    return value


def _modern_dispatch(actor: AgentActor, req: Request) -> dict[str, Any] | ToolResult:
    version = MODERN_VERSIONS[0]
    if req.method == "server/discover":
        return {
            "supportedVersions": [*MODERN_VERSIONS, *HANDSHAKE_VERSIONS],
            "capabilities": CAPABILITIES,
            "instructions": _instructions(actor),
            "ttlMs": 0,
            "cacheScope": "private",
        }
    if req.method == "tools/list":
        return {**_tools_list(actor, version, req.params), "ttlMs": 0, "cacheScope": "private"}
    if req.method == "tools/call":
        return _tools_call(actor, req.params, version)
    if req.method in RESOURCE_METHODS and req.method not in SUBSCRIBE_METHODS:
        return {**_resources(actor, req), "ttlMs": 0, "cacheScope": "private"}
    raise RpcError(METHOD_NOT_FOUND, f"Method not found: {req.method}")


# A 2026-07-28 result's last members (``_modern``): its type, and the server's name in _meta.
_MODERN_TAIL = ',"resultType":"complete","_meta":' + _dumps({SERVER_INFO_KEY: SERVER_INFO})


# --- the handshake era: sessions ----------------------------------------------------------------


def _session_key(actor: AgentActor, session_id: str) -> str:
    return f"{SESSION_PREFIX}{actor.endpoint.slug}:{session_id}"


def _session_create(actor: AgentActor, version: str) -> str:
    session_id = secrets.token_urlsafe(24)
    record = {"endpoint": str(actor.endpoint.id), "version": version, "initialized": False}
    counters.client().set(
        _session_key(actor, session_id), json.dumps(record), ex=SESSION_TTL_SECONDS
    )
    return session_id


def _session_get(actor: AgentActor, session_id: str) -> dict[str, Any] | None:
    key = _session_key(actor, session_id)
    pipe = counters.client().pipeline(transaction=False)
    pipe.get(key)
    pipe.expire(key, SESSION_TTL_SECONDS)
    raw, _ = pipe.execute()
    if raw is None:
        return None
    record: dict[str, Any] = json.loads(raw)
    if record.get("endpoint") != str(actor.endpoint.id):
        return None
    return record


def _session_mark_initialized(actor: AgentActor, session_id: str, record: dict[str, Any]) -> None:
    if not record.get("initialized"):
        record["initialized"] = True
        counters.client().set(
            _session_key(actor, session_id), json.dumps(record), ex=SESSION_TTL_SECONDS
        )


def _notification(ring: Ring, meta: dict[str, Any] | None = None) -> str:
    """A ring as a ``notifications/resources/updated`` for the todo's resource, which both
    official SDKs surface to the client; ``_meta`` names the queue and the reason (and, on a
    listen stream, the subscription)."""
    message = {
        "jsonrpc": "2.0",
        "method": "notifications/resources/updated",
        "params": {
            "uri": f"{TODO_URI}{ring.todo}",
            "_meta": {**(meta or {}), READY_META: ring.as_dict()},
        },
    }
    return f"id: {ring.id}\nevent: message\ndata: {json.dumps(message)}\n\n"


def _event_stream(body: AsyncIterator[str], session_id: str | None = None) -> HttpResponseBase:
    response = StreamingHttpResponse(body, content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    if session_id is not None:
        response["Mcp-Session-Id"] = session_id
    return response


def _listen(request: Incoming, actor: AgentActor, req: Request) -> HttpResponseBase:
    """``subscriptions/listen`` (2026-07-28): the response is the stream. Its first frame is
    ``notifications/subscriptions/acknowledged`` with the honored subset of the filter; then one
    ``notifications/resources/updated`` per ring, every frame stamped with the request's id
    under ``_meta[SUBSCRIPTION_ID_KEY]``. Only resource subscriptions to the todos
    (``switchboard://todos/``) are honored: the tool list never changes and there are no other
    resources. No replay: a client that re-listens is rung again for what waits (attach)."""
    accept = request.headers.get("Accept", "")
    if "text/event-stream" not in accept:
        raise _bad_header(
            406, "subscriptions/listen answers with a stream: Accept text/event-stream", "Accept"
        )
    notifications = req.params.get("notifications")
    if not isinstance(notifications, dict):
        raise RpcError(INVALID_PARAMS, "params.notifications must be an object")
    requested = notifications.get("resourceSubscriptions") or []
    if not isinstance(requested, list) or not all(isinstance(u, str) for u in requested):
        raise RpcError(INVALID_PARAMS, "params.notifications.resourceSubscriptions must be URIs")
    honored: dict[str, Any] = {}
    if any(uri.rstrip("/") == TODO_URI.rstrip("/") for uri in requested):
        honored["resourceSubscriptions"] = [TODO_URI]
    meta = {SUBSCRIPTION_ID_KEY: req.id}
    ack = {
        "jsonrpc": "2.0",
        "method": "notifications/subscriptions/acknowledged",
        "params": {"notifications": honored, "_meta": meta},
    }

    def render(ring: Ring) -> str:
        return _notification(ring, meta)

    async def body() -> AsyncIterator[str]:
        yield f"event: message\ndata: {json.dumps(ack)}\n\n"
        if not honored:
            # Nothing asked for is sent here: close at once, gracefully (the listen result),
            # rather than hold an idle stream open.
            close = {"jsonrpc": "2.0", "id": req.id, "result": {"_meta": meta}}
            yield f"event: message\ndata: {json.dumps(close)}\n\n"
            return
        # A revoke ends the listen with the refusal its next request would get.
        gone = Unauthorized(REVOKED_MESSAGE)
        refusal = {
            "jsonrpc": "2.0",
            "id": req.id,
            "error": RpcError(SERVER_ERROR, gone.message, gone.as_dict()).as_dict(),
        }
        revoked = f"event: message\ndata: {json.dumps(refusal)}\n\n"
        # Closed explicitly when this stream is: an ``async for`` left early does not close
        # the generator it read, and its ``finally`` (the doorbell's detach) would wait for GC.
        async with contextlib.aclosing(
            ring_stream(str(actor.endpoint.id), None, render=render, revoked=revoked)
        ) as rings:
            async for chunk in rings:
                yield chunk

    release_connection()
    return _event_stream(body())


def _get_stream(request: Incoming, actor: AgentActor) -> Reply | HttpResponseBase:
    """The server-to-client stream of the handshake revisions: the doorbell's rings for this
    endpoint, as notifications, on the session the handshake opened."""
    accept = request.headers.get("Accept", "")
    if "text/event-stream" not in accept and "*/*" not in accept:
        raise _bad_header(406, "the Accept header must include text/event-stream", "Accept")
    session_id = request.headers.get("Mcp-Session-Id")
    if not session_id:
        # The 2026-07-28 revision has no GET stream: its clients listen by request instead.
        refused = MethodNotAllowed(
            "GET needs the Mcp-Session-Id of a handshake session", method="GET", field=SESSION
        )
        return _transport(None, SERVER_ERROR, refused, headers={"Allow": "POST, DELETE"})
    if _session_get(actor, session_id) is None:
        return _transport(None, INVALID_REQUEST, _no_session())
    release_connection()
    rings = ring_stream(
        str(actor.endpoint.id), request.headers.get("Last-Event-ID"), render=_notification
    )
    return _event_stream(_while_session(rings, _session_key(actor, session_id)), session_id)


async def _while_session(rings: AsyncGenerator[str, None], key: str) -> AsyncIterator[str]:
    """The stream of a handshake session, ended once the session is (a DELETE, from this client
    or any other, or its expiry): it went on for ever, rings and all, for a session every
    request of which answered 404. Asked at each keepalive (every 15 s while nothing rings) and
    at most that often while rings flow; a Valkey that does not answer keeps the stream."""
    checked = time.monotonic()
    async with contextlib.aclosing(rings) as source:
        async for chunk in source:
            now = time.monotonic()
            if chunk == KEEPALIVE or now - checked >= KEEPALIVE_SECONDS:
                checked = now
                if not await asyncio.to_thread(_session_alive, key):
                    return
            yield chunk


def _session_alive(key: str) -> bool:
    try:
        return bool(counters.client().exists(key))
    except Exception:  # redis unavailable: the session may well be alive
        return True


def _delete(request: Incoming, actor: AgentActor) -> Reply:
    session_id = _header(request, SESSION)
    if not session_id:
        missing = InvalidArgument("Mcp-Session-Id header is required", field=SESSION)
        return _transport(None, INVALID_REQUEST, missing)
    removed = counters.client().delete(_session_key(actor, session_id))
    if not removed:
        return _transport(None, INVALID_REQUEST, _no_session())
    return _empty(204)


def _legacy(request: Incoming, actor: AgentActor, message: Any) -> Reply:
    try:
        if isinstance(message, dict) and message.get("method") == "initialize":
            return _initialize(actor, message)
        session_id = _header(request, SESSION)
        if not session_id:
            raise InvalidArgument(
                "Mcp-Session-Id header is required; send initialize first", field=SESSION
            )
        record = _session_get(actor, session_id)
        if record is None:
            raise _no_session()
        # The header, when sent, is one of HANDSHAKE_VERSIONS (others are routed to _modern and
        # refused there); the spec answers by it even when it is not the negotiated one.
        version: str = _header(request, "MCP-Protocol-Version") or record["version"]
    except (InvalidArgument, NotFound) as exc:
        return _transport(_request_id(message), INVALID_REQUEST, exc)

    def handle(req: Request) -> dict[str, Any] | None:
        return _legacy_dispatch(
            actor, req, version, lambda: _initialized(actor, session_id, record)
        )

    if isinstance(message, list):
        # The session's revision decides (a header may name another for one request, but a
        # session that negotiated a revision without batches does not take them).
        if not {version, record["version"]} <= set(BATCH_VERSIONS):
            without = record["version"] if record["version"] not in BATCH_VERSIONS else version
            error = RpcError(
                INVALID_REQUEST, f"JSON-RPC batches are not part of protocol {without}"
            )
            return _rpc_error(None, error, 400)
        if not message:
            return _rpc_error(None, RpcError(INVALID_REQUEST, "Invalid Request: empty batch"), 400)

        def handle_charged(req: Request) -> dict[str, Any] | None:
            # Each call of a batch is charged as a request alone is: one over the rate is
            # refused in its own answer (the others keep theirs), never run uncharged.
            if req.method in CHARGED and not req.is_notification:
                try:
                    check_endpoint_rate(actor.endpoint)
                except RateLimited as exc:
                    raise RpcError(SERVER_ERROR, exc.message, exc.as_dict()) from None
            return handle(req)

        answers = [a for a in (_answer(m, handle_charged) for m in message) if a is not None]
        return _json(answers) if answers else _empty(202)
    try:
        parsed = _parse_message(message)
    except RpcError as exc:
        return _rpc_error(_request_id(message), exc, 400)
    if parsed is None or parsed.is_notification:
        if parsed is not None:
            handle(parsed)
        return _empty(202)
    answer = _answer(message, handle)
    return _json(answer)


def _initialized(actor: AgentActor, session_id: str, record: dict[str, Any]) -> None:
    try:
        _session_mark_initialized(actor, session_id, record)
    except redis.RedisError:
        log.warning("could not record notifications/initialized for an MCP session")


def _answer(
    message: Any, handle: Callable[[Request], dict[str, Any] | None]
) -> dict[str, Any] | None:
    """The response object for one message of a POST (None for notifications and responses)."""
    try:
        parsed = _parse_message(message)
        if parsed is None:
            return None
        if parsed.method == "initialize":
            raise RpcError(INVALID_REQUEST, "initialize must be sent alone, not in a batch")
        result = handle(parsed)
        if parsed.is_notification:
            return None
        return {"jsonrpc": "2.0", "id": parsed.id, "result": result}
    except Exception as exc:
        if isinstance(exc, DomainError) or is_outage(exc):
            raise  # the view answers these with their HTTP status (a refusal, 503)
        if isinstance(message, dict) and "id" not in message and "method" in message:
            return None  # errors are never sent for notifications
        error = exc if isinstance(exc, RpcError) else _handler_failed()
        return {"jsonrpc": "2.0", "id": _request_id(message), "error": error.as_dict()}


def _initialize(actor: AgentActor, message: dict[str, Any]) -> Reply:
    id_ = _request_id(message)
    try:
        parsed = _parse_message(message)
    except RpcError as exc:
        return _rpc_error(id_, exc, 400)
    assert parsed is not None
    if parsed.is_notification:
        return _rpc_error(
            None, RpcError(INVALID_REQUEST, "initialize is a request: give it an id"), 400
        )
    requested = parsed.params.get("protocolVersion")
    if not isinstance(requested, str):
        said = "is required" if requested is None else "must be a string, e.g. 2025-11-25"
        return _rpc_error(id_, RpcError(INVALID_PARAMS, f"params.protocolVersion {said}"), 200)
    if not isinstance(parsed.params.get("capabilities", {}), dict):
        return _rpc_error(
            id_, RpcError(INVALID_PARAMS, "params.capabilities must be an object"), 200
        )
    version = requested if requested in HANDSHAKE_VERSIONS else HANDSHAKE_VERSIONS[0]
    session_id = _session_create(actor, version)
    result = {
        "protocolVersion": version,
        "capabilities": CAPABILITIES,
        "serverInfo": SERVER_INFO,
        "instructions": _instructions(actor),
    }
    return _json(
        {"jsonrpc": "2.0", "id": id_, "result": result}, headers={"Mcp-Session-Id": session_id}
    )


def _legacy_dispatch(
    actor: AgentActor, req: Request, version: str, on_initialized: Callable[[], None]
) -> dict[str, Any] | None:
    if req.is_notification:
        if req.method == "notifications/initialized":
            on_initialized()
        return None  # other notifications (cancelled, progress, roots) need nothing from us
    if req.method == "ping":
        return {}
    if req.method == "tools/list":
        return _tools_list(actor, version, req.params)
    if req.method == "tools/call":
        return _tools_call(actor, req.params, version).as_dict()
    if req.method in RESOURCE_METHODS:
        return _resources(actor, req)
    raise RpcError(METHOD_NOT_FOUND, f"Method not found: {req.method}")


# --- the endpoint's todos as resources ----------------------------------------------------------

SUBSCRIBE_METHODS = frozenset({"resources/subscribe", "resources/unsubscribe"})
RESOURCE_METHODS = frozenset(
    {"resources/list", "resources/templates/list", "resources/read", *SUBSCRIBE_METHODS}
)


def _resources(actor: AgentActor, req: Request) -> dict[str, Any]:
    """``_resource_answer``, a refusal (a grant the endpoint lacks) as this request's JSON-RPC
    error: in a batch the other calls keep their answers (a claim made before it is not lost)."""
    try:
        return _resource_answer(actor, req)
    except DomainError as exc:
        if is_outage(exc):
            raise
        raise RpcError(SERVER_ERROR, exc.message, exc.as_dict()) from None


def _resource_answer(actor: AgentActor, req: Request) -> dict[str, Any]:
    """``resources/*``: the endpoint's todos, ``switchboard://todos/<id>``. Listing needs the
    list_todos verb and reading get_todo (a refusal is the transport's 403, as a tool's grant);
    a subscription is acknowledged and changes nothing: a handshake session's stream carries
    every todo's updates from the start (the doorbell rings by endpoint, not by URI)."""
    if req.method == "resources/templates/list":
        if req.params.get("cursor") is not None:
            raise RpcError(INVALID_PARAMS, "params.cursor is not one this server gave out")
        return {"resourceTemplates": [TODO_TEMPLATE]}
    if req.method == "resources/list":
        return _resources_list(actor, req.params.get("cursor"))
    uri = req.params.get("uri")
    if not isinstance(uri, str):
        raise RpcError(INVALID_PARAMS, f"{req.method} needs params.uri, a todo's URI")
    if req.method in SUBSCRIBE_METHODS:
        _todo_id(uri)  # a URI of ours, or refused
        return {}
    return _resources_read(actor, uri)


def _todo_id(uri: str) -> str:
    """The todo a URI names, spelt as the server spells it (the URIs it lists and notifies)."""
    todo_id = uri.removeprefix(TODO_URI) if uri.startswith(TODO_URI) else ""
    try:
        canonical = str(UUID(todo_id))
    except ValueError:
        return _no_such(uri)
    return canonical if canonical == todo_id else _no_such(uri)


def _no_such(uri: str) -> str:
    # As the official SDK's server answers it (and 2025-11-25 on: -32002 is retired).
    raise RpcError(INVALID_PARAMS, f"Resource not found: {uri}", {"uri": uri})


def _resources_list(actor: AgentActor, cursor: Any) -> dict[str, Any]:
    if cursor is not None and not isinstance(cursor, str):
        raise RpcError(INVALID_PARAMS, "params.cursor must be a string this server gave out")
    spec = verbs.get("list_todos")
    assert spec is not None
    try:
        page = verbs.call(actor, spec, spec.parse({"limit": 100, "cursor": cursor}))
    except InvalidArgument:
        raise RpcError(INVALID_PARAMS, "params.cursor is not one this server gave out") from None
    resources = [
        {
            "uri": f"{TODO_URI}{todo['id']}",
            "name": str(todo["id"]),
            "title": todo["title"],
            "description": f"{todo['state']} on {todo['queue']}",
            "mimeType": "application/json",
        }
        for todo in page["todos"]
    ]
    result: dict[str, Any] = {"resources": resources}
    if page.get("next_cursor"):
        result["nextCursor"] = page["next_cursor"]
    return result


def _resources_read(actor: AgentActor, uri: str) -> dict[str, Any]:
    spec = verbs.get("get_todo")
    assert spec is not None
    verbs.check_grant(actor, spec.name)  # before the URI: no grant, nothing to say of it
    try:
        text = _as_dumped(verbs.call_json(actor, spec, spec.parse({"id": _todo_id(uri)})))
    except NotFound:
        _no_such(uri)
    return {"contents": [{"uri": uri, "mimeType": "application/json", "text": text}]}
