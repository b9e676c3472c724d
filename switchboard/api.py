"""The one NinjaAPI at /api/v1 and its error mapping.

Every error is ``{"error": "<sentence>", "code": "<code>", ...details}``: domain errors from
``switchboard.errors``, request validation as ``invalid_argument`` naming the field.
"""

from __future__ import annotations

import logging
from typing import Any

from django.http import HttpRequest, HttpResponse
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, HttpError
from ninja.errors import ValidationError as NinjaValidationError

from switchboard.errors import DomainError

log = logging.getLogger(__name__)

api = NinjaAPI(
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


def error_response(request: HttpRequest, exc: DomainError) -> HttpResponse:
    response = api.create_response(request, exc.as_dict(), status=exc.status)
    retry_after = exc.details.get("retry_after")
    if retry_after is not None:
        response["Retry-After"] = str(retry_after)
    elif exc.code == "deferred" and exc.details.get("exact") and exc.details.get("retry_after_s"):
        response["Retry-After"] = str(exc.details["retry_after_s"])
    return response


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
    return api.create_response(
        request,
        {"error": "authentication is required", "code": "unauthorized"},
        status=401,
    )


@api.exception_handler(HttpError)
def on_http_error(request: HttpRequest, exc: HttpError) -> HttpResponse:
    codes = {400: "invalid_argument", 401: "unauthorized", 403: "forbidden", 404: "not_found"}
    body: dict[str, Any] = {"error": str(exc), "code": codes.get(exc.status_code, "conflict")}
    if exc.status_code == 400:
        body["field"] = "body"
    return api.create_response(request, body, status=exc.status_code)


@api.exception_handler(Exception)
def on_unexpected(request: HttpRequest, exc: Exception) -> HttpResponse:
    log.exception("unhandled error on %s %s", request.method, request.path)
    return api.create_response(
        request, {"error": "internal error; it has been logged", "code": "internal"}, status=500
    )
