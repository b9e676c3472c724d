"""Security headers on every response (CSP, nosniff and referrer policy; frames come from Django),
and the edge check of every request's path, query and form fields (``switchboard.core.validation``):
a NUL character anywhere is refused before any view runs (PostgreSQL cannot store it).

One middleware, not two: under ASGI each sync-only middleware costs a thread hop."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from django.conf import settings
from django.core.exceptions import (
    DisallowedHost,
    PermissionDenied,
    RequestAborted,
    RequestDataTooBig,
    SuspiciousOperation,
    TooManyFieldsSent,
)
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.http.multipartparser import MultiPartParserError
from django.template.loader import render_to_string

from switchboard.core import availability, pages
from switchboard.core.errors import (
    DomainError,
    Forbidden,
    InvalidArgument,
    MethodNotAllowed,
    NotFound,
)
from switchboard.core.http import FORM_TYPES
from switchboard.core.validation import check_text
from switchboard.mcp import refusal_response

ARRIVED = "switchboard.arrived"

CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'self'; form-action 'self'"
)


def _signed_in(request: HttpRequest) -> bool:
    user = getattr(request, "user", None)
    try:
        return bool(user is not None and user.is_authenticated)
    except Exception:  # the session store is down: treat the answer as private
        return True


class SecurityHeadersMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        # The deadline counts from arrival at the server (stamped in switchboard.asgi), so time
        # spent queued for a worker thread counts too.
        scope = getattr(request, "scope", None) or {}
        arrived = scope.get(ARRIVED, time.monotonic())
        with availability.request_deadline(arrived):
            try:
                check_request_text(request)
            except InvalidArgument as exc:
                response: HttpResponse = edge_refusal(request, exc)
            else:
                response = self.get_response(request)
        if (
            response.status_code == 405
            and not getattr(response, "streaming", False)
            and not response.content
            and not _machine(request)
        ):
            response = _method_page(request, response)
        if response.status_code == 204:
            # No content, so no type: Django's default (text/html) described a body not sent.
            response.headers.pop("Content-Type", None)
        # One policy for every page, the API docs included (ninja's bundled Swagger UI, served
        # under /static/, needs no CDN and no inline script).
        response.headers.setdefault("Content-Security-Policy", CONTENT_SECURITY_POLICY)
        if "Cache-Control" not in response.headers and (
            "Authorization" in request.headers or _signed_in(request)
        ):
            # What a signed-in person or a token holder sees is theirs: never kept by a cache.
            # (A view that chose its own policy, e.g. the event stream's, keeps it.)
            response.headers["Cache-Control"] = "no-store"
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        response.headers.setdefault("Referrer-Policy", "same-origin")
        return response

    def process_exception(self, request: HttpRequest, exc: Exception) -> HttpResponse | None:
        return outage_refusal(request, exc)


def outage_refusal(request: HttpRequest, exc: Exception) -> HttpResponse | None:
    """A dependency that did not answer is 503 with Retry-After on every page, not a 500."""
    if not availability.is_outage(exc):
        return None
    refusal = availability.outage(exc)
    response = edge_refusal(request, refusal)
    response["Retry-After"] = str(refusal.details["retry_after"])
    return response


def edge_refusal(request: HttpRequest, exc: DomainError) -> HttpResponse:
    """A refusal made before any view ran (or a dependency that did not answer), in the shape
    the caller reads: a JSON-RPC error on /mcp (no id: the body was never read), the API's error
    object on the other paths a machine reads, and a page for a person (a browser shown the
    error object as text, on the sign-in page in an outage, could not tell what happened)."""
    if request.path.startswith("/mcp/"):
        return refusal_response(exc)
    if _machine(request):
        return JsonResponse(exc.as_dict(), status=exc.status)
    return refusal_page(request, exc)


# The paths a machine reads (the API and MCP, and the metrics): a refusal there is never a page.
MACHINE_PREFIXES = ("/mcp/", "/api/")
MACHINE_PATHS = ("/metrics",)


def _machine(request: HttpRequest) -> bool:
    return request.path.startswith(MACHINE_PREFIXES) or request.path in MACHINE_PATHS


def refusal_page(request: HttpRequest, exc: DomainError) -> HttpResponse:
    """The refusal as a page of its own, rendered without the request's context (no user, no
    session: the database may be what did not answer). To htmx, the message alone and
    ``HX-Reswap: none``: the page keeps what it shows (a form what was typed in it) and
    static/js/console.js says what happened above it."""
    details = exc.as_dict()
    context = {
        "status": exc.status,
        "message": exc.message,
        "retry_after": details.get("retry_after"),
        "again": request.get_full_path() if request.method in ("GET", "HEAD") else None,
    }
    if request.headers.get("HX-Request") == "true":
        response = HttpResponse(
            render_to_string("refused.html#message", context), status=exc.status
        )
        response["HX-Reswap"] = "none"
        return response
    return HttpResponse(render_to_string("refused.html", context), status=exc.status)


def bad_request(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """Django's 400 (a Host not in ALLOWED_HOSTS, a malformed request): never an HTML page for an
    agent or API client, which cannot read one."""
    if isinstance(exception, DisallowedHost) or exception is None:
        refusal = InvalidArgument(
            "The request is malformed or names a host this server does not serve.", field="host"
        )
    else:  # another SuspiciousOperation: nothing to do with the host
        refusal = InvalidArgument("The request is malformed.", field="request")
    if _machine(request):
        return edge_refusal(request, refusal)
    # The page made without the request's context: a bad Host fails every URL built from it.
    return HttpResponse(
        render_to_string("refused.html", {"status": 400, "message": refusal.message}),
        status=400,
    )


def not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """Django's 404 for a path no route serves: the API's error object (a JSON-RPC error on
    /mcp) for an agent or API client, which cannot read a page; the console's page otherwise
    (Django's bare "Not Found" before)."""
    if _machine(request):
        refusal = NotFound(f"no such path: {request.method} {request.path}", path=request.path)
        return edge_refusal(request, refusal)
    return console_error_page(request, NotFound(f"There is no page at {request.path}."))


def forbidden(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """Django's 403 (the admin's PermissionDenied): the console's page, saying what the viewer
    may do instead, not Django's bare "403 Forbidden"."""
    if _machine(request):
        return edge_refusal(request, Forbidden("you may not do this"))
    return console_error_page(
        request,
        Forbidden(
            "Your account may not open this page or do this. Auditors read and do not change; "
            "ask a superuser for the permission if you need it."
        ),
    )


def csrf_failure(request: HttpRequest, reason: str = "") -> HttpResponse:
    """A form whose CSRF token no longer matches (the session changed since the page was
    loaded: signed in again, or in another tab). Django's page said "CSRF verification failed
    … More information is available with DEBUG=True", and htmx swapped it over the list the
    form was in; here it is a refusal page, or to htmx its message with no swap (the page keeps
    the list and what was typed, and says it above)."""
    refusal = Forbidden(
        "This page is out of date: your session changed after it was loaded (you signed in "
        "again, or signed out in another tab), so what it sent was not accepted and nothing "
        "changed. Load the page again, then send it again.",
        reason="csrf",
    )
    return edge_refusal(request, refusal)


def console_error_page(request: HttpRequest, exc: DomainError) -> HttpResponse:
    """The console's own 403 or 404 page (``switchboard.core.pages.refusal``: the menu, a way
    back); to htmx its message, with no swap: the page keeps what it shows and says it above."""
    response = pages.refusal(request, exc)
    if request.headers.get("HX-Request") == "true":
        response["HX-Reswap"] = "none"
    return response


def _method_page(request: HttpRequest, response: HttpResponse) -> HttpResponse:
    """A 405 with no body (``require_POST``) for a person: a page saying what the address is
    for, keeping ``Allow`` (a bookmark or a reload of a form's address showed a blank page)."""
    allowed = response.get("Allow", "")
    page = refusal_page(
        request,
        MethodNotAllowed(
            f"This address is for a form's {allowed or 'POST'}, not for opening in the browser: "
            "go back to the page the form was on.",
            method=request.method,
        ),
    )
    if allowed:
        page["Allow"] = allowed
    return page


def check_request_text(request: HttpRequest) -> None:
    """Refuse a NUL (or a lone surrogate) in the path, a query parameter or a form field."""
    check_text(request.path, "path")
    try:
        sources = [request.GET]
    except TooManyFieldsSent:
        raise _too_many_fields("query") from None
    if request.method == "POST" and request.content_type in FORM_TYPES:
        # Django parses a multipart body from its stream, after which ``request.body`` raises:
        # the API's body bound and parser read it next (a form posted to an operation was a
        # 500). Read it first, so the form is parsed from the kept copy. No view takes a file.
        # Past DATA_UPLOAD_MAX_MEMORY_SIZE nothing is read (Django refuses before reading):
        # nobody can read that form, and the API's bound answers it 413 by its length.
        try:
            request.body  # noqa: B018  (read for its effect)
        except RequestDataTooBig:
            pass
        else:
            try:
                sources.append(request.POST)
            except TooManyFieldsSent:
                # Django's 400 for it read as a bad Host, with an ERROR traceback in the log.
                raise _too_many_fields("body") from None
            except MultiPartParserError as exc:
                # No boundary, say: Django's 400 for it read as a bad Host, with a traceback.
                # MCP refuses every form by its Content-Type (415): it keeps that answer.
                if not request.path.startswith("/mcp/"):
                    raise InvalidArgument(
                        f"body: is not a readable form ({exc})", field="body"
                    ) from None
    for source in sources:
        for key, values in source.lists():
            check_text(key, "query")
            for value in values:
                check_text(value, key)


def _too_many_fields(where: str) -> InvalidArgument:
    most = settings.DATA_UPLOAD_MAX_NUMBER_FIELDS
    return InvalidArgument(
        f"{where}: more than {most} fields; no form of this site has that many", field=where
    )


def stop_without_alarms(record: logging.LogRecord) -> bool:
    """A logging filter for ``uvicorn.error`` and ``asyncio``: at a graceful stop uvicorn cancels
    the event streams still open past its bound, as designed (they never end by themselves;
    ``switchboard.asgi`` ends each as a stream ends and the client reconnects elsewhere), and
    said so as an ERROR, with asyncio's traceback of Django's disconnect listener for each
    stream after it: an alarm on every deploy for nothing wrong (chaos10, hooks10). Both are one
    INFO line now."""
    if record.name == "uvicorn.error" and "timeout graceful shutdown exceeded" in str(record.msg):
        record.levelno, record.levelname = logging.INFO, "INFO"
        record.msg = f"{record.msg} (open event streams, ended as streams end)"
    exc = record.exc_info[1] if record.exc_info else None
    if record.name == "asyncio" and isinstance(exc, RequestAborted):
        record.levelno, record.levelname = logging.INFO, "INFO"
        record.msg, record.args = "a request ended by the server's stop: its client was let go", ()
        record.exc_info = None
        record.exc_text = None
    return True


def refusals_without_tracebacks(record: logging.LogRecord) -> bool:
    """A logging filter for ``django.request`` and ``django.security``: a 403 of the admin's
    (PermissionDenied, an auditor opening an add form) is a refusal like any other, logged in
    its one line, without the traceback Django attaches (a page of it per refusal in the
    server's log). So is a request Django finds suspicious (a Host not in ALLOWED_HOSTS, a
    malformed cookie or multipart body): the client's fault, answered 400, so a WARNING, not an
    ERROR with the server's stack, which a scanner could fill the log with."""
    exc = record.exc_info[1] if record.exc_info else None
    if isinstance(exc, PermissionDenied | SuspiciousOperation):
        record.exc_info = None
        record.exc_text = None
    if isinstance(exc, SuspiciousOperation) and record.levelno > logging.WARNING:
        record.levelno, record.levelname = logging.WARNING, "WARNING"
    if getattr(record, "status_code", None) == 503 and record.levelno > logging.WARNING:
        # An outage answered as designed (503 unavailable, Retry-After, nothing changed): the
        # outage is the news, not each request it refused, which Django logs as an ERROR apiece
        # (regress9b: one per create and per board reconnect while a dependency was down).
        record.levelno, record.levelname = logging.WARNING, "WARNING"
    return True
