"""MCP over Streamable HTTP at ``/mcp/<slug>``: JSON-RPC 2.0, the agent verbs as tools.

Revisions served:

* **2026-07-28** (stateless): each POST is one self-contained request carrying its protocol
  version and client capabilities in ``params._meta``, mirrored in the ``MCP-Protocol-Version``,
  ``Mcp-Method`` (and for ``tools/call`` ``Mcp-Name``) headers. Methods: ``server/discover``,
  ``tools/list``, ``tools/call``. No sessions. A request is routed here when its
  ``MCP-Protocol-Version`` header names a version outside the handshake era (as the SDK's
  server does), and the envelope ladder then checks it: ``-32602`` for a missing envelope key,
  ``-32020`` for a header that disagrees with the body, ``-32022`` (with ``supported``) for an
  unknown version.
* **2025-11-25, 2025-06-18, 2025-03-26, 2024-11-05** (handshake): ``initialize`` negotiates the
  version (the client's if served, else 2025-11-25) and issues an ``Mcp-Session-Id`` kept in
  Redis (sliding TTL) for that endpoint; later requests must carry it (400 without, 404 when
  unknown or ended), and a ``MCP-Protocol-Version`` header, when sent, must match the
  negotiated version (400). ``notifications/initialized`` (202), ``ping``, ``tools/list``,
  ``tools/call``; ``DELETE`` ends the session. JSON-RPC batches are accepted only on sessions
  that negotiated 2025-03-26 or 2024-11-05 (later revisions removed them).

Responses are always ``application/json`` (never SSE); a POST must accept it (406) and send it
(415). ``GET`` is 405 (there is no server-to-client stream). Tool results carry
``structuredContent`` (from 2025-06-18) and the same JSON as text; a refusal is a result with
``isError: true`` carrying the API's error object. Protocol faults are JSON-RPC errors: -32700
malformed JSON, -32600 invalid request, -32601 unknown method, -32602 bad params or unknown tool.

Transport refusals before JSON-RPC is read use the API's error shape (``{"error", "code"}``):
401 unknown or revoked token, 403 a token of another endpoint or a foreign ``Origin``, 429 over
the endpoint's request rate (with ``Retry-After``), 413 a body over 1 MiB.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import redis
from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt

from queues.access import AgentActor
from queues.auth import authenticate_agent
from switchboard.core import counters, verbs
from switchboard.core.errors import DomainError, Forbidden, InvalidArgument, Unauthorized
from switchboard.core.http import API_BODY_LIMIT, check_body_size, retry_after_seconds

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

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
HEADER_MISMATCH = -32020
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


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> HttpResponse:
    response = HttpResponse(
        json.dumps(body, separators=(",", ":")), status=status, content_type="application/json"
    )
    for name, value in (headers or {}).items():
        response[name] = value
    return response


def _refusal(exc: DomainError) -> HttpResponse:
    """A transport-level refusal in the API's error shape."""
    response = _json(exc.as_dict(), status=exc.status)
    seconds = retry_after_seconds(exc)
    if seconds is not None:
        response["Retry-After"] = str(seconds)
    if exc.status == 401:
        response["WWW-Authenticate"] = 'Bearer realm="switchboard"'
    return response


def _rpc_error(id_: Id, error: RpcError, status: int) -> HttpResponse:
    return _json({"jsonrpc": "2.0", "id": id_, "error": error.as_dict()}, status=status)


def _accepts_json(request: HttpRequest) -> bool:
    types = [
        part.split(";")[0].strip().lower() for part in request.headers.get("Accept", "").split(",")
    ]
    return any(t in ("application/json", "application/*", "*/*") for t in types)


def _origin_allowed(request: HttpRequest) -> bool:
    """DNS-rebinding guard: a browser's Origin must be this host or a trusted origin."""
    origin = request.headers.get("Origin")
    if not origin:
        return True
    if origin in settings.CSRF_TRUSTED_ORIGINS:
        return True
    return urlsplit(origin).netloc == request.get_host()


@csrf_exempt
def mcp_view(request: HttpRequest, slug: str) -> HttpResponse:
    if request.method not in ("POST", "DELETE"):
        response = HttpResponse(status=405)
        response["Allow"] = "POST, DELETE"
        return response
    try:
        check_body_size(request, API_BODY_LIMIT)
        if not _origin_allowed(request):
            raise Forbidden("this Origin may not call the MCP endpoint")
        actor = _authenticate(request, slug)
    except DomainError as exc:
        return _refusal(exc)
    if request.method == "DELETE":
        return _delete(request, actor)
    return _post(request, actor)


def _authenticate(request: HttpRequest, slug: str) -> AgentActor:
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("send Authorization: Bearer sbk_… (the endpoint's token)")
    actor = authenticate_agent(request, token.strip(), via="mcp")
    if actor.endpoint.slug != slug:
        raise Forbidden("this token belongs to another endpoint's MCP URL")
    return actor


def _post(request: HttpRequest, actor: AgentActor) -> HttpResponse:
    if not _accepts_json(request):
        return _refusal(
            _bad_header(406, "the Accept header must include application/json", "Accept")
        )
    content_type = request.headers.get("Content-Type", "").split(";")[0].strip().lower()
    if content_type != "application/json":
        return _refusal(
            _bad_header(415, "the body must be Content-Type: application/json", "Content-Type")
        )
    try:
        message = json.loads(request.body)
    except (ValueError, RecursionError):
        return _rpc_error(None, RpcError(PARSE_ERROR, "Parse error: the body is not JSON"), 400)
    version = request.headers.get("MCP-Protocol-Version")
    if version is not None and version not in HANDSHAKE_VERSIONS:
        return _modern(request, actor, message)
    return _legacy(request, actor, message)


def _bad_header(status: int, message: str, field: str) -> DomainError:
    """An invalid_argument refusal with a transport status (406, 415) naming the header."""
    exc = InvalidArgument(message, field=field)
    exc.status = status
    return exc


# --- JSON-RPC envelopes -------------------------------------------------------------------------


@dataclass
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


def _tools_list(actor: AgentActor, version: str) -> dict[str, Any]:
    tools = []
    for spec in verbs.granted(actor):
        tool: dict[str, Any] = {
            "name": spec.name,
            "description": spec.description,
            "inputSchema": spec.input_schema(),
        }
        if version in STRUCTURED_VERSIONS:
            tool["outputSchema"] = spec.output_schema()
        tools.append(tool)
    return {"tools": tools}


def _tools_call(actor: AgentActor, params: dict[str, Any], version: str) -> dict[str, Any]:
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
        output = verbs.call(actor, spec, spec.parse(arguments))
        is_error = False
    except DomainError as exc:
        output = exc.as_dict()
        is_error = True
    text = json.dumps(output, separators=(",", ":"))
    result: dict[str, Any] = {"content": [{"type": "text", "text": text}], "isError": is_error}
    if version in STRUCTURED_VERSIONS:
        result["structuredContent"] = output
    return result


def _instructions(actor: AgentActor) -> str:
    queues = ", ".join(actor.endpoint.scope_queues)
    return (
        f"Switchboard work queue for endpoint {actor.endpoint.slug} (queues: {queues}). "
        "Call claim_next to take work, heartbeat while you hold it, then complete or fail it. "
        'claim_next answers {"empty": true} when there is nothing to do.'
    )


# --- 2026-07-28: stateless requests ------------------------------------------------------------


def _modern(request: HttpRequest, actor: AgentActor, message: Any) -> HttpResponse:
    """One self-contained request (see the module docstring for the ladder)."""
    header_version = request.headers.get("MCP-Protocol-Version", "")
    if isinstance(message, dict) and "id" not in message:
        # A notification: the revision defines none from client to server; acknowledge it.
        try:
            _parse_message(message)
        except RpcError as exc:
            return _rpc_error(None, exc, 400)
        if header_version not in MODERN_VERSIONS:
            return _rpc_error(None, _unsupported(header_version), 400)
        return HttpResponse(status=202)
    try:
        parsed = _parse_message(message)
        if parsed is None or parsed.is_notification:
            raise RpcError(
                INVALID_REQUEST, "Invalid Request: a single JSON-RPC request is required"
            )
        _check_envelope(request, parsed)
        result = _modern_dispatch(actor, parsed)
    except RpcError as exc:
        return _rpc_error(_request_id(message), exc, MODERN_ERROR_STATUS.get(exc.code, 200))
    result.setdefault("resultType", "complete")
    result["_meta"] = {SERVER_INFO_KEY: SERVER_INFO}
    return _json({"jsonrpc": "2.0", "id": parsed.id, "result": result})


def _unsupported(requested: Any) -> RpcError:
    return RpcError(
        UNSUPPORTED_PROTOCOL_VERSION,
        "Unsupported protocol version",
        {"supported": [*MODERN_VERSIONS, *HANDSHAKE_VERSIONS], "requested": requested},
    )


def _check_envelope(request: HttpRequest, req: Request) -> None:
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
    if request.headers.get("MCP-Protocol-Version") != version:
        raise RpcError(
            HEADER_MISMATCH, "the MCP-Protocol-Version header does not match params._meta"
        )
    if request.headers.get("Mcp-Method") != req.method:
        raise RpcError(HEADER_MISMATCH, "the Mcp-Method header does not match the method")
    name = req.params.get("name")
    if (
        req.method == "tools/call"
        and name is not None
        and _header_value(request.headers.get("Mcp-Name")) != name
    ):
        raise RpcError(HEADER_MISMATCH, "the Mcp-Name header does not match params.name")
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


def _modern_dispatch(actor: AgentActor, req: Request) -> dict[str, Any]:
    version = MODERN_VERSIONS[0]
    if req.method == "server/discover":
        return {
            "supportedVersions": [*MODERN_VERSIONS, *HANDSHAKE_VERSIONS],
            "capabilities": {"tools": {"listChanged": False}},
            "instructions": _instructions(actor),
            "ttlMs": 0,
            "cacheScope": "private",
        }
    if req.method == "tools/list":
        return {**_tools_list(actor, version), "ttlMs": 0, "cacheScope": "private"}
    if req.method == "tools/call":
        return _tools_call(actor, req.params, version)
    raise RpcError(METHOD_NOT_FOUND, f"Method not found: {req.method}")


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


def _sessions_unavailable() -> HttpResponse:
    log.exception("MCP session store unavailable")
    return _json(
        {"error": "MCP sessions are unavailable right now; retry shortly", "code": "internal"},
        status=503,
        headers={"Retry-After": "5"},
    )


def _delete(request: HttpRequest, actor: AgentActor) -> HttpResponse:
    session_id = request.headers.get("Mcp-Session-Id")
    if not session_id:
        return _rpc_error(None, RpcError(INVALID_REQUEST, "Mcp-Session-Id header is required"), 400)
    try:
        removed = counters.client().delete(_session_key(actor, session_id))
    except redis.RedisError:
        return _sessions_unavailable()
    if not removed:
        return _rpc_error(None, RpcError(INVALID_REQUEST, "Session not found"), 404)
    return HttpResponse(status=204)


def _legacy(request: HttpRequest, actor: AgentActor, message: Any) -> HttpResponse:
    try:
        if isinstance(message, dict) and message.get("method") == "initialize":
            return _initialize(actor, message)
        session_id = request.headers.get("Mcp-Session-Id")
        if not session_id:
            raise _Transport(400, "Mcp-Session-Id header is required; send initialize first")
        record = _session_get(actor, session_id)
        if record is None:
            raise _Transport(404, "Session not found; it ended or expired: initialize again")
        version: str = record["version"]
        header = request.headers.get("MCP-Protocol-Version")
        if header is not None and header != version:
            raise _Transport(400, f"MCP-Protocol-Version {header} is not this session's {version}")
    except _Transport as exc:
        return _rpc_error(_request_id(message), RpcError(INVALID_REQUEST, exc.message), exc.status)
    except redis.RedisError:
        return _sessions_unavailable()

    def handle(req: Request) -> dict[str, Any] | None:
        return _legacy_dispatch(
            actor, req, version, lambda: _initialized(actor, session_id, record)
        )

    if isinstance(message, list):
        if version not in BATCH_VERSIONS:
            error = RpcError(
                INVALID_REQUEST, f"JSON-RPC batches are not part of protocol {version}"
            )
            return _rpc_error(None, error, 400)
        if not message:
            return _rpc_error(None, RpcError(INVALID_REQUEST, "Invalid Request: empty batch"), 400)
        answers = [a for a in (_answer(m, handle) for m in message) if a is not None]
        return _json(answers) if answers else HttpResponse(status=202)
    try:
        parsed = _parse_message(message)
    except RpcError as exc:
        return _rpc_error(_request_id(message), exc, 400)
    if parsed is None or parsed.is_notification:
        if parsed is not None:
            handle(parsed)
        return HttpResponse(status=202)
    answer = _answer(message, handle)
    return _json(answer)


class _Transport(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


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
    except RpcError as exc:
        if isinstance(message, dict) and "id" not in message and "method" in message:
            return None  # errors are never sent for notifications
        return {"jsonrpc": "2.0", "id": _request_id(message), "error": exc.as_dict()}


def _initialize(actor: AgentActor, message: dict[str, Any]) -> HttpResponse:
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
        return _rpc_error(id_, RpcError(INVALID_PARAMS, "params.protocolVersion is required"), 200)
    if not isinstance(parsed.params.get("capabilities", {}), dict):
        return _rpc_error(
            id_, RpcError(INVALID_PARAMS, "params.capabilities must be an object"), 200
        )
    version = requested if requested in HANDSHAKE_VERSIONS else HANDSHAKE_VERSIONS[0]
    try:
        session_id = _session_create(actor, version)
    except redis.RedisError:
        return _sessions_unavailable()
    result = {
        "protocolVersion": version,
        "capabilities": {"tools": {"listChanged": False}},
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
        return _tools_list(actor, version)
    if req.method == "tools/call":
        return _tools_call(actor, req.params, version)
    raise RpcError(METHOD_NOT_FOUND, f"Method not found: {req.method}")
