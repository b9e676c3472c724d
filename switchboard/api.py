"""The one NinjaAPI at /api/v1 and its error mapping.

Every error is ``{"error": "<sentence>", "code": "<code>", ...details}``: domain errors from
``switchboard.core.errors``, request validation as ``invalid_argument`` naming the field (a
query parameter the operation does not declare included), a method a path does not take as
``method_not_allowed``.

Request bodies are bounded: 1 MiB for everything under /api/v1 and /mcp (``bounded_urls`` below and
``switchboard.mcp``), by ``switchboard.core.http``; a route with a tighter bound (16 KiB for policy
writes) wraps its view itself, and its ``BodyTooLarge`` maps to the same 413.
"""

from __future__ import annotations

import copy
import inspect
import logging
from datetime import datetime
from functools import wraps
from typing import Any

from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed
from django.http.response import HttpResponseBase
from django.urls import URLPattern, URLResolver
from ninja import NinjaAPI, Swagger
from ninja.errors import AuthenticationError, HttpError
from ninja.errors import ValidationError as NinjaValidationError
from ninja.renderers import JSONRenderer
from ninja.responses import NinjaJSONEncoder
from pydantic import BaseModel, ValidationError

from admission.api import router as admission_router
from admission.limits.api import router as limits_router
from admission.selectors import SCOPE_RE
from queues.access import AgentActor
from queues.api import build_agent_router, endpoints_router, todos_router
from queues.api_queues import router as queues_router
from queues.auth import authenticate_agent
from queues.models import LIMIT_NAME_RE, QUEUE_NAME_RE
from switchboard.core import availability, validation, verbs
from switchboard.core.errors import DomainError, InvalidArgument, MethodNotAllowed
from switchboard.core.http import (
    API_BODY_LIMIT,
    IF_MATCH_RE,
    IF_NONE_MATCH_RE,
    REFUSED_BODY,
    BodyTooLarge,
    EdgeParser,
    bounded,
    check_body_size,
    error_response,
    field_name,
    unknown_parameter,
    unwanted_body,
)
from switchboard.core.times import iso
from switchboard.core.tokens import bearer_token
from switchboard.core.zones import zones

log = logging.getLogger(__name__)


class _Encoder(NinjaJSONEncoder):
    """ninja's, writing instants as every other surface does (``switchboard.core.times``):
    Django's encoder cut them to milliseconds, so an operator read another ``updated_at`` than
    the agent did of the same todo."""

    def default(self, o: Any) -> Any:
        if isinstance(o, datetime):
            return iso(o)
        return super().default(o)


class _Renderer(JSONRenderer):
    encoder_class = _Encoder


class _SwitchboardAPI(NinjaAPI):
    """The document states what every operation may answer besides its own (``answers_of_all``)."""

    def get_openapi_schema(self, *args: Any, **kwargs: Any) -> Any:
        schema = super().get_openapi_schema(*args, **kwargs)
        schema.setdefault("paths", {})[EVENTS_PATH] = {"get": copy.deepcopy(_EVENTS_OPERATION)}
        return answers_of_all(schema)


_ERROR = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorOut"}}}
# The agents' event stream (``queues.events.agent_events``): a Django view, not a ninja route,
# since it streams; written into the document by hand so a client generated from it knows it.
EVENTS_PATH = "/api/v1/agent/events"
EVENT_STREAM = "text/event-stream"
_EVENTS_OPERATION: dict[str, Any] = {
    "operationId": "agent_events",
    "summary": "The doorbell as server-sent events: a ring when work may be claimable",
    "description": (
        "A stream that stays open: each ring is one event, `id` (the point to resume from), "
        "`event: todo_ready` and `data` a JSON object naming the `todo` (its id), its `queue` "
        "and the `reason` it rang. On connect it rings for up to three claimable todos already "
        "waiting; with `Last-Event-ID`, only for those that changed since that event, and when "
        "none did but work waits, once for the oldest (`waiting`). A comment line comes every "
        "15 seconds while nothing rings. A ring is a hint: claim with claim_next. Opening the "
        "stream costs one request of the endpoint's rate, as does HEAD, which answers its head "
        "without opening it. A revoke of the endpoint ends the stream."
    ),
    "tags": ["agent"],
    "security": [{"VerbAuth": []}],
    "parameters": [
        {
            "name": "Last-Event-ID",
            "in": "header",
            "required": False,
            "description": "The `id` of the last event received, to resume after it",
            "schema": {"type": "string"},
        }
    ],
    "responses": {
        "200": {
            "description": "The stream (it does not end on its own)",
            "content": {EVENT_STREAM: {"schema": {"type": "string"}}},
        },
        "401": {
            "description": "a bearer token is required, or it is unknown or revoked",
            "content": _ERROR,
        },
        "429": {"description": "the endpoint's request rate is spent", "content": _ERROR},
    },
}
_RETRY_AFTER = {
    "Retry-After": {
        "description": "Seconds to wait before trying again",
        "schema": {"type": "integer", "minimum": 0},
    }
}
# Answers any operation may give, whatever it does: a query parameter it does not take (or a
# body it cannot read, or any body where it takes none) is 400; PostgreSQL or Redis not
# answering is 503 (``When a dependency is down`` in the README); an operation with a body
# refuses one over 1 MiB (413).
_EVERY = {
    "400": "invalid_argument, naming the field (a query parameter the operation does not take, "
    "or a body sent to an operation that takes none, included)",
    "503": "unavailable: PostgreSQL or Redis did not answer in time; nothing was changed",
}
_WITH_BODY = {"413": "the request body is over 1 MiB"}
# A budget's and a limit's version (If-Match / If-None-Match), on the answers that show it.
_ETAG = {"ETag": {"description": "The version this answer shows", "schema": {"type": "string"}}}
_VERSIONED = {
    ("/api/v1/admission/{scope}/{queue}", "get"),
    ("/api/v1/admission/{scope}/{queue}", "put"),
    ("/api/v1/limits/{kind}/{name}", "put"),
    ("/api/v1/endpoints/{slug}", "patch"),
}


# Parameters the services check against a pattern (400 naming the field otherwise): the
# document says the pattern, from the same constant (s43: schemathesis sent "schema-valid" names
# the server refused, since the document allowed any string).
_PARAMETER_PATTERNS = {
    ("path", "queue"): QUEUE_NAME_RE,
    ("path", "scope"): SCOPE_RE,
    ("header", "If-Match"): IF_MATCH_RE,
    ("header", "If-None-Match"): IF_NONE_MATCH_RE,
}
_LIMITS_PATH = "/api/v1/limits/{kind}/{name}"


def answers_of_all(schema: Any) -> Any:
    """Each operation's answers, with those every operation may give (``_EVERY``), 413 where it
    takes a body, and the headers that come with them: Retry-After on 429 and 503, ETag where
    an answer shows a version; the pattern of each parameter the services check
    (``_PARAMETER_PATTERNS``, a limit's name); a window's zones by name and when it takes a
    weekday; and no NUL in any other string (``_no_nul``)."""
    for path, operations in schema.get("paths", {}).items():
        for method, operation in operations.items():
            for parameter in operation.get("parameters", []):
                pattern = _PARAMETER_PATTERNS.get((parameter.get("in"), parameter["name"]))
                if parameter["name"] == "name" and path.startswith(_LIMITS_PATH):
                    pattern = LIMIT_NAME_RE
                if parameter.get("in") in ("path", "header"):
                    parameter["schema"] = _never_null(parameter.get("schema", {}))
                if pattern is not None:
                    parameter["schema"]["pattern"] = pattern
                _no_nul(parameter.get("schema"))
            responses = operation.setdefault("responses", {})
            codes = {str(code) for code in responses}
            extra = dict(_EVERY)
            if "requestBody" in operation or method in ("post", "put", "patch"):
                extra.update(_WITH_BODY)
            for code, description in extra.items():
                if code not in codes:
                    responses[int(code)] = {"description": description, "content": _ERROR}
            for code, answer in responses.items():
                if str(code) in ("429", "503"):
                    answer.setdefault("headers", {}).update(_RETRY_AFTER)
                if (path, method) in _VERSIONED and str(code) == "200":
                    answer.setdefault("headers", {}).update(_ETAG)
    for name, component in schema.get("components", {}).get("schemas", {}).items():
        zone = component.get("properties", {}).get("tz")
        if name.endswith("In") and zone is not None and zone.get("type") == "string":
            # Said here, not in the model, so MCP's tool schemas (an agent's model reads them)
            # do not carry some 600 names.
            zone["enum"] = zones()
            if "weekday" in component["properties"]:
                component.update(_WEEKDAY_ONLY_FOR_A_WEEK)
        _no_nul(component)
    return schema


# A window's weekday: required for a week window, and only for one (``admission.policy``).
_WEEKDAY_ONLY_FOR_A_WEEK = {
    "if": {"properties": {"period": {"const": "week"}}},
    "then": {"required": ["weekday"], "properties": {"weekday": {"type": "string"}}},
    "else": {"properties": {"weekday": {"type": "null"}}},
}


def _never_null(schema: dict[str, Any]) -> dict[str, Any]:
    """A header's or a path's schema without the ``null`` its optional Python type gave it: a
    header is sent or not, never null (schemathesis sent the text "null")."""
    branches = [b for b in schema.get("anyOf", []) if b.get("type") != "null"]
    if len(branches) != 1 or len(schema["anyOf"]) == 1:
        return schema
    rest = {key: value for key, value in schema.items() if key != "anyOf"}
    return {**branches[0], **rest}


# Where a schema nests others (a JSON value of any shape, ``{}``, is not walked into: its strings'
# rule is said in words where it is stored, ``validation``).
_NESTED_ONE = ("items", "additionalProperties")
_NESTED_MANY = ("anyOf", "allOf", "oneOf")
_OWN_RULE = frozenset({"pattern", "enum", "format", "const"})


def _no_nul(schema: Any) -> None:
    """Every plain string in ``schema`` refuses a NUL character, as ``validation.text_problem``
    does for every string a client sends (PostgreSQL stores none): the document says so with a
    pattern, on strings that have none of their own (nor an enum or a format, which exclude it)."""
    stack = [schema]
    while stack:
        node = stack.pop()
        if not isinstance(node, dict):
            continue
        if node.get("type") == "string" and not node.keys() & _OWN_RULE:
            node["pattern"] = validation.NO_NUL_RE
        stack.extend(node.get("properties", {}).values())
        stack.extend(node.get(key) for key in _NESTED_ONE)
        for key in _NESTED_MANY:
            stack.extend(node.get(key, []))


api = _SwitchboardAPI(
    renderer=_Renderer(),
    parser=EdgeParser(),
    title="Switchboard",
    version="1",
    urls_namespace="api",
    docs_url="/docs",
    # Without deep links: each operation's path was a link inside the button that opens it, two
    # controls in one that a keyboard and a screen reader cannot tell apart (axe:
    # nested-interactive, serious). templates/ninja/swagger.html is the page.
    docs=Swagger(settings={"deepLinking": False}),
    description=(
        "Admission control and operations for work queues that AI agents drain. Agents use "
        "/agent/… with `Authorization: Bearer sbk_…`; operators use the rest with a session or "
        "`Authorization: Bearer sbh_…`."
    ),
)


def bounded_urls(
    urls: tuple[list[URLPattern | URLResolver], str, str], limit: int = API_BODY_LIMIT
) -> tuple[list[URLPattern | URLResolver], str, str]:
    """``api.urls`` with every view behind ``bounded``."""
    patterns, app_name, namespace = urls
    for pattern in patterns:
        if isinstance(pattern, URLPattern):
            pattern.callback = bounded(_not_allowed_as_json(pattern.callback), limit)
    return patterns, app_name, namespace


def _not_allowed_as_json(view: Any) -> Any:
    """ninja answers a method a path does not take with a plain-text 405; the API's clients
    read every refusal as the error object, so this one is too (its ``Allow`` header kept).
    ninja serves no HEAD: a path that takes GET answers HEAD as its GET, without the body
    (RFC 9110 9.3.2), and lists it in ``Allow``."""

    @wraps(view)  # ninja's csrf_exempt mark included
    def answered(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        response = view(request, *args, **kwargs)
        if not isinstance(response, HttpResponseNotAllowed):
            return response
        allowed = sorted(m.strip() for m in response["Allow"].split(",") if m.strip())
        if "GET" in allowed:
            if request.method == "HEAD":
                return _head_of(view, request, *args, **kwargs)
            allowed = sorted([*allowed, "HEAD"])
        refusal = MethodNotAllowed(
            f"{request.method} is not a method of this path; it takes {', '.join(allowed)}",
            method=request.method,
            allowed=allowed,
        )
        answer = error_response(request, refusal)
        answer["Allow"] = ", ".join(allowed)
        return answer

    return answered


def _head_of(view: Any, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
    """The GET's answer to a HEAD: its status and headers, its length, no body."""
    request.method = "GET"
    try:
        response = view(request, *args, **kwargs)
    finally:
        request.method = "HEAD"
    if isinstance(response, HttpResponse):
        length = len(response.content)
        response.content = b""
        response["Content-Length"] = str(length)
    return response


@api.exception_handler(DomainError)
def on_domain_error(request: HttpRequest, exc: DomainError) -> HttpResponse:
    return error_response(request, exc)


@api.exception_handler(NinjaValidationError)
def on_validation_error(request: HttpRequest, exc: NinjaValidationError) -> HttpResponse:
    first = exc.errors[0] if exc.errors else {}
    name = field_name(first.get("loc", ()))
    message = str(first.get("msg", "is invalid")).removeprefix("Value error, ")
    return api.create_response(
        request,
        {
            "error": f"{name}: {message}",
            "code": "invalid_argument",
            "field": name,
            "errors": [
                {"field": field_name(e.get("loc", ())), "message": str(e.get("msg", ""))}
                for e in exc.errors
            ],
        },
        status=400,
    )


@api.exception_handler(AuthenticationError)
def on_auth_error(request: HttpRequest, exc: AuthenticationError) -> HttpResponse:
    response = api.create_response(
        request,
        {"error": "authentication is required", "code": "unauthorized"},
        status=401,
    )
    response["WWW-Authenticate"] = 'Bearer realm="switchboard"'
    return response


@api.exception_handler(HttpError)
def on_http_error(request: HttpRequest, exc: HttpError) -> HttpResponse:
    refused = getattr(request, REFUSED_BODY, None)
    if refused is not None and exc.status_code == 400:
        return error_response(request, refused)  # the body's edge check, naming the field
    codes = {400: "invalid_argument", 401: "unauthorized", 403: "forbidden", 404: "not_found"}
    body: dict[str, Any] = {"error": str(exc), "code": codes.get(exc.status_code, "conflict")}
    if exc.status_code == 400:
        body["field"] = "body"
    return api.create_response(request, body, status=exc.status_code)


@api.exception_handler(Exception)
def on_unexpected(request: HttpRequest, exc: Exception) -> HttpResponse:
    if availability.is_outage(exc):
        log.warning("%s %s: dependency unavailable: %s", request.method, request.path, exc)
        return error_response(request, availability.outage(exc))
    log.exception("unhandled error on %s %s", request.method, request.path)
    return api.create_response(
        request, {"error": "internal error; it has been logged", "code": "internal"}, status=500
    )


# --- query parameters an operation does not take, or takes once; a body it does not take -----

# Where ``_query_check`` leaves its refusal of a request (of its query, or of a body the
# operation does not take); ``_query_refusal`` raises it once ninja has authenticated the request
# and validated the parameters the operation declares, as the body's edge refusal is answered
# (an agent without the verb still hears 403 first).
REFUSED_QUERY = "_switchboard_query_refused"


# Where ninja reads an operation's body from: an operation with none of these takes no body.
_BODY_SOURCES = frozenset({"body", "form", "file"})


def _query_check(run: Any) -> Any:
    """ninja's ``view`` decorator of every operation: notes the first query parameter the
    operation does not declare, or a declared one of a single value given more than once
    (ninja reads the declared ones, the last of repeated values, and ignores the rest, so a
    mistyped filter, ``?stat=revoked``, would answer as if there were none); else, for an
    operation that takes no body, a body that says anything (ninja would not read it, so
    ``{"attempt": 2}`` sent to a release would release whichever attempt holds the claim)."""
    if getattr(run, "query_checked", False):
        return run  # a nested router's operations inherit the API's decorators once more
    operation = inspect.unwrap(run).__self__
    queries = [m for m in operation.models if m.__ninja_param_source__ == "query"]
    names = frozenset(name for model in queries for name in model.__ninja_flatten_map__)
    lists = frozenset(name for model in queries for name in model.__ninja_collection_fields__)
    takes = ", ".join(sorted(names)) or "none"
    takes_body = any(m.__ninja_param_source__ in _BODY_SOURCES for m in operation.models)

    @wraps(run)
    def checked(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        refusal = None
        for name, values in request.GET.lists():
            if name not in names:
                refusal = unknown_parameter(name, takes)
            elif len(values) > 1 and name not in lists:  # ninja would take the last one
                refusal = InvalidArgument(
                    f"{name}: given {len(values)} times; it takes one value", field=name
                )
            if refusal is not None:
                break
        if refusal is None and not takes_body:
            refusal = unwanted_body(request.body, names)
        if refusal is not None:
            setattr(request, REFUSED_QUERY, refusal)
        return run(request, *args, **kwargs)

    checked.query_checked = True  # type: ignore[attr-defined]
    return checked


def _query_refusal(view_func: Any) -> Any:
    """ninja's ``operation`` decorator of every operation: raises what ``_query_check`` noted,
    after authentication and the declared parameters' validation, before the view."""
    if getattr(view_func, "query_checked", False):
        return view_func

    @wraps(view_func)
    def refusing(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        refused = getattr(request, REFUSED_QUERY, None)
        if refused is not None:
            raise refused
        return view_func(request, *args, **kwargs)

    refusing.query_checked = True  # type: ignore[attr-defined]
    return refusing


api.add_decorator(_query_check, mode="view")
api.add_decorator(_query_refusal, mode="operation")

_mounted = False


def mount_routers() -> NinjaAPI:
    """Mount every router once: the agent verbs (generated from the verb registry, so after the
    apps are ready), the operators' endpoints and todos, the queues and admission routers."""
    global _mounted
    if _mounted:
        return api
    api.add_router("/agent/", build_agent_router())
    api.add_router("/endpoints", endpoints_router)
    api.add_router("/todos", todos_router)
    api.add_router("/", queues_router)
    api.add_router("/", admission_router)
    api.add_router("/", limits_router)
    _mounted = True
    return api


def urls() -> tuple[list[URLPattern | URLResolver], str, str]:
    """The URLconf entry for /api/v1/: every router mounted, every view body-bounded, the agent
    verbs' plain requests served by their operation directly (``agent_verb_direct``)."""
    patterns, app_name, namespace = bounded_urls(mount_routers().urls)
    for pattern in patterns:
        route = str(pattern.pattern)
        spec = verbs.get(route.removeprefix("agent/")) if route.startswith("agent/") else None
        if isinstance(pattern, URLPattern) and spec is not None:
            pattern.callback = _direct_first(pattern.callback, spec)
    return patterns, app_name, namespace


# --- the agent verbs' direct operation ----------------------------------------------------------


def _direct_first(view: Any, spec: verbs.VerbSpec) -> Any:
    @wraps(view)  # ninja's csrf_exempt mark included
    def agent_verb(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        response = agent_verb_direct(request, spec)
        return view(request, *args, **kwargs) if response is None else response

    # The verb this view serves: switchboard.asgi's agent path serves a URL's plain requests
    # itself only while the URL still resolves to this view.
    agent_verb.agent_verb_spec = spec  # type: ignore[attr-defined]
    return agent_verb


def agent_verb_direct(request: HttpRequest, spec: verbs.VerbSpec) -> HttpResponseBase | None:
    """The agent verb's ninja operation (``queues.api.build_agent_router``), run directly for a
    plain request: a POST with a bearer token and a JSON body that passes the edge check and the
    verb's input model. None for anything else, before anything was charged or changed: the
    caller then serves the request through ninja, which answers it (errors included) as before.

    Why (issue 11): ninja's per-request work (its parameter models, the auth and response
    plumbing) cost a tenth of an agent request's CPU. What the operation does
    is kept step by step: the grant and the rate with the credentials before the body counts
    (``VerbAuth``), the verb's input model, ``verbs.call``, and every exception through the
    API's own handlers (``api.on_exception``), so answers and error shapes are the same. The
    answer is the same JSON as ninja's ``Response`` of it, written compactly in one pass
    (``verbs.call_json``). ninja still defines the routes, the OpenAPI schema and every other path.
    """
    if request.method != "POST" or request.GET:
        return None
    token = bearer_token(request.headers.get("Authorization", ""))
    if token is None:
        return None
    if request.content_type != "application/json" and request.body:
        return None  # ninja reads other types as JSON too; its answer is left to it
    try:
        check_body_size(request, API_BODY_LIMIT)
    except BodyTooLarge:
        return None
    data = verb_input(spec, request.body)
    if data is None:
        return None
    try:
        actor = agent_for_verb(token, spec)
        request.auth = actor  # type: ignore[attr-defined]  # as ninja sets it
        return HttpResponse(verbs.call_json(actor, spec, data), content_type="application/json")
    except Exception as exc:
        return api.on_exception(request, exc)


def agent_for_verb(token: str, spec: verbs.VerbSpec) -> AgentActor:
    """``VerbAuth``: the agent behind the token (401), its request rate charged (429), then
    the verb's grant (403)."""
    actor = authenticate_agent(None, token, via="api")
    verbs.check_grant(actor, spec.name)
    return actor


def verb_input(spec: verbs.VerbSpec, body: bytes) -> BaseModel | None:
    """The verb's input from a body within ``API_BODY_LIMIT`` that passes the edge check, or
    None (ninja answers)."""
    try:
        if not body:
            return spec.input()  # an empty body is the defaults, when every field has one
        # model_validate, without its Python-level wrapper
        return spec.input.__pydantic_validator__.validate_python(validation.loads(body))
    except (InvalidArgument, ValidationError):
        return None
