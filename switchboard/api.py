"""The one NinjaAPI at /api/v1 and its error mapping.

Every error is ``{"error": "<sentence>", "code": "<code>", ...details}``: domain errors from
``switchboard.errors``, request validation as ``invalid_argument`` naming the field.

Request bodies are bounded: 1 MiB for everything under /api/v1 and /mcp (``bounded_urls`` below and
``switchboard.mcp``). An oversized body is refused before it is parsed with HTTP 413 and the
``invalid_argument`` shape naming the field ``body`` (plus ``limit`` and ``size`` in bytes). A route
with a tighter bound calls ``check_body_size(request, limit)`` itself (e.g. 16 KiB for policy
writes); it raises ``BodyTooLarge``, which the handlers here map to the same 413.
"""

from __future__ import annotations

import importlib
import logging
import math
from collections.abc import Callable
from datetime import datetime
from functools import wraps
from typing import Any

from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse
from django.urls import URLPattern, URLResolver
from django.utils import timezone
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, HttpError
from ninja.errors import ValidationError as NinjaValidationError
from ninja.parser import Parser

from switchboard import availability, validation
from switchboard.errors import DomainError, InvalidArgument

log = logging.getLogger(__name__)

# Where ``bounded`` leaves a body it has parsed and checked (so it is parsed once), or why it
# refused it: the refusal is answered when the view reads the body, after authentication, so an
# agent without the verb still hears 403 first.
_PARSED = "_switchboard_json"
_REFUSED = "_switchboard_json_refused"


class EdgeParser(Parser):
    """ninja's body parser, reading what the edge check already parsed (``bounded``)."""

    def parse_body(self, request: HttpRequest) -> Any:
        refused = getattr(request, _REFUSED, None)
        if refused is not None:
            raise refused  # ninja turns it into HttpError(400); on_http_error answers it
        if hasattr(request, _PARSED):
            return getattr(request, _PARSED)
        try:
            return validation.loads(request.body)
        except InvalidArgument as exc:
            setattr(request, _REFUSED, exc)
            raise


api = NinjaAPI(
    parser=EdgeParser(),
    title="Switchboard",
    version="1",
    urls_namespace="api",
    docs_url="/docs",
    description=(
        "Admission control and operations for work queues that AI agents drain. Agents use "
        "/agent/… with `Authorization: Bearer sbk_…`; operators use the rest with a session or "
        "`Authorization: Bearer sbh_…`."
    ),
)


API_BODY_LIMIT = 1024 * 1024


class BodyTooLarge(InvalidArgument):
    """A request body over its route's bound: invalid_argument on the field "body", as HTTP 413."""

    status = 413


def check_body_size(request: HttpRequest, limit: int) -> None:
    """Refuse a request body longer than ``limit`` bytes (raises ``BodyTooLarge``).

    Trusts a Content-Length over the limit without reading; otherwise measures the body (which
    Django has already buffered, and which the parser reads next anyway).
    """
    declared = request.headers.get("Content-Length", "")
    size = int(declared) if declared.isdigit() else None
    if size is None or size <= limit:
        try:
            size = len(request.body) if request.method not in ("GET", "HEAD", "OPTIONS") else 0
        except RequestDataTooBig:
            # A chunked body (no Content-Length) past Django's own buffer bound.
            size = max(limit + 1, getattr(request, "_stream_size", 0))
    if size > limit:
        raise BodyTooLarge(
            f"the request body is {size} bytes; the limit here is {limit}",
            field="body",
            limit=limit,
            size=size,
        )


def retry_after_seconds(exc: DomainError) -> int | None:
    """Seconds to send as Retry-After: a rate limit's wait, or an exact deferral's eligibility."""
    retry_after = exc.details.get("retry_after")
    if retry_after is not None:
        return int(retry_after)
    if exc.code == "deferred" and exc.details.get("exact"):
        if exc.details.get("retry_after_s"):
            return int(exc.details["retry_after_s"])
        eligible = exc.details.get("next_eligible_at")
        if isinstance(eligible, str):
            try:
                eligible = datetime.fromisoformat(eligible)
            except ValueError:
                return None
        if isinstance(eligible, datetime):
            return max(0, math.ceil((eligible - timezone.now()).total_seconds()))
    return None


def error_response(request: HttpRequest, exc: DomainError) -> HttpResponse:
    response = api.create_response(request, exc.as_dict(), status=exc.status)
    seconds = retry_after_seconds(exc)
    if seconds is not None:
        response["Retry-After"] = str(seconds)
    if exc.status == 401:
        response["WWW-Authenticate"] = 'Bearer realm="switchboard"'
    return response


def check_request(request: HttpRequest) -> None:
    """The edge check of an API request's JSON body (the path and query are checked by
    ``switchboard.middleware``): parsed once, strictly, and kept for the view."""
    if request.method not in ("POST", "PUT", "PATCH", "DELETE") or not request.body:
        return
    kind = request.content_type or ""
    if kind in ("application/json", "", "text/plain") or kind.endswith("+json"):
        try:
            setattr(request, _PARSED, validation.loads(request.body))
        except InvalidArgument as exc:
            setattr(request, _REFUSED, exc)


def bounded(view: Callable[..., HttpResponse], limit: int = API_BODY_LIMIT) -> Any:
    """A view that refuses oversized bodies before anything else reads them."""

    @wraps(view)
    def guarded(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        try:
            check_body_size(request, limit)
            check_request(request)
        except BodyTooLarge as exc:
            return error_response(request, exc)
        return view(request, *args, **kwargs)

    return guarded


def bounded_urls(
    urls: tuple[list[URLPattern | URLResolver], str, str], limit: int = API_BODY_LIMIT
) -> tuple[list[URLPattern | URLResolver], str, str]:
    """``api.urls`` with every view behind ``bounded``."""
    patterns, app_name, namespace = urls
    for pattern in patterns:
        if isinstance(pattern, URLPattern):
            pattern.callback = bounded(pattern.callback, limit)
    return patterns, app_name, namespace


def field_name(loc: list[Any] | tuple[Any, ...]) -> str:
    """Pydantic's error location without the request part: ("body", "payload", "window", "tz")
    → "window.tz"."""
    parts = [str(p) for p in loc]
    if parts and parts[0] in ("body", "query", "path", "header", "cookie", "form"):
        parts = parts[1:]
    if parts and parts[0] in ("payload", "body", "data"):
        parts = parts[1:]
    return ".".join(parts) or "body"


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
    refused = getattr(request, _REFUSED, None)
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


# Routers: mounted when the URLconf asks for them (``urls()``), not at import, so a module that
# imports this one (for ``bounded`` or ``check_body_size``) can itself be a router module.
APP_ROUTERS = ("queues.api_queues", "admission.api")  # each mounted at /api/v1/ if it exists
_mounted = False


def mount_routers() -> NinjaAPI:
    """Mount every router once: the agent verbs (generated from the verb registry), the
    operators' endpoints and todos, then each app router in APP_ROUTERS that exists."""
    global _mounted
    if _mounted:
        return api
    from queues.api import build_agent_router, endpoints_router, todos_router

    api.add_router("/agent/", build_agent_router())
    api.add_router("/endpoints", endpoints_router)
    api.add_router("/todos", todos_router)
    for name in APP_ROUTERS:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue
        api.add_router("/", module.router)  # a module here without a router is a mistake
    _mounted = True
    return api


def urls() -> tuple[list[URLPattern | URLResolver], str, str]:
    """The URLconf entry for /api/v1/: every router mounted, every view body-bounded."""
    return bounded_urls(mount_routers().urls)
