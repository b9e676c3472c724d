"""The HTTP edge every surface shares: the one error shape, body bounds, Retry-After.

Every error is ``{"error": "<sentence>", "code": "<code>", ...details}`` (``DomainError.as_dict``).
Request bodies are bounded (1 MiB by default); an oversized body is refused before it is parsed
with HTTP 413 and ``invalid_argument`` naming the field ``body`` (plus ``limit`` and ``size``).
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Callable, Collection, Mapping
from datetime import datetime
from functools import wraps
from typing import Any, Protocol

from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.utils.http import parse_header_parameters
from ninja import Header, Schema
from ninja.parser import Parser
from ninja.responses import NinjaJSONEncoder
from pydantic import ConfigDict

from switchboard.core import validation, versions
from switchboard.core.errors import DomainError, InvalidArgument, field_path


class ErrorOut(Schema):
    """Every refusal, on every route: a sentence, a code, the field at fault, and any additive
    details (``limit``, ``next_eligible_at``, ...)."""

    model_config = ConfigDict(extra="allow")
    error: str
    code: str
    field: str | None = None


@functools.lru_cache(maxsize=64)
def media_type(content_type: str) -> str:
    """The media type of a Content-Type value, lowercased, as ``HttpRequest.content_type`` reads
    it; remembered, as an agent sends the same few values (issue 11: the agents' lean paths)."""
    return parse_header_parameters(content_type)[0]


def json_response(body: dict[str, Any], *, status: int) -> HttpResponse:
    """JSON as the API renders it (the NinjaAPI's renderer uses the same encoder)."""
    return HttpResponse(
        json.dumps(body, cls=NinjaJSONEncoder),
        status=status,
        content_type="application/json; charset=utf-8",
    )


API_BODY_LIMIT = 1024 * 1024


# --- conditional writes (RFC 9110 section 13.1: If-Match, If-None-Match) ------------------------

# An entity tag's characters (RFC 9110's etagc: visible ASCII but the quote, and obs-text).
_ETAGC = r"[\x21\x23-\x7e\x80-\xff]"
# One member of an entity-tag list: an optional weak mark, then the quoted tag.
_ENTITY_TAG = re.compile(rf'[ \t]*(W/)?"({_ETAGC}*)"[ \t]*(?:,|$)')
_LIST_GAP = re.compile(r"[ \t]*,")
# The same grammar as one pattern, for the OpenAPI document (``switchboard.api``), so the headers
# it calls valid are those ``write_preconditions`` takes: ``*``, or a list of quoted tags (empty
# members allowed, at least one tag). A test holds the two to each other.
_TAG = rf'[ \t]*(?:W/)?"{_ETAGC}*"[ \t]*'
IF_MATCH_RE = rf"^(?:[ \t]*\*[ \t]*|(?:[ \t]*,)*(?:{_TAG}(?:,(?:[ \t]*,)*|$))+)$"
IF_NONE_MATCH_RE = r"^[ \t]*\*[ \t]*$"


def entity_tag(version: str) -> str:
    """A version as a strong entity tag (the ETag header's value)."""
    return f'"{version}"'


def _entity_tags(value: str, header: str) -> tuple[str, ...]:
    """The strong tags of an If-Match list. A weak tag never matches under the strong comparison
    a write needs, so it is dropped (a list of weak tags alone matches nothing)."""
    tags: list[str] = []
    at = 0
    while at < len(value):
        gap = _LIST_GAP.match(value, at)  # an empty member, allowed by the list syntax
        if gap is not None:
            at = gap.end()
            continue
        match = _ENTITY_TAG.match(value, at)
        if match is None or match.end() == at:
            raise InvalidArgument(
                f'{header} must be * or a list of quoted entity tags such as "{"0" * 20}"',
                field=header,
            )
        if match[1] is None:
            tags.append(match[2])
        at = match.end()
    if not tags and not value.strip(" \t,"):
        raise InvalidArgument(f"{header} is empty", field=header)
    return tuple(tags)


def if_match_header(what: str) -> Any:
    """A write's If-Match header parameter (documented in the OpenAPI document)."""
    return Header(
        None,
        alias="If-Match",
        description=f'Write only over this version (the ETag read, quoted: "…"), or * for {what}',
    )


def if_none_match_header(what: str) -> Any:
    """A write's If-None-Match header parameter: only ``*`` (create only)."""
    return Header(None, alias="If-None-Match", description=f"* : {what}")


def write_preconditions(if_match: str | None, if_none_match: str | None) -> tuple[str, ...] | None:
    """The versions a conditional write may replace (``switchboard.core.versions``), from its
    If-Match / If-None-Match headers.

    None when neither is sent (write whatever is there). ``If-Match: *``: ``versions.ANY`` (any
    current version); ``If-Match: "v1", "v2"``: those; ``If-None-Match: *``: ``versions.ABSENT``
    (only where there is none yet). A malformed header, both at once, or an If-None-Match other
    than ``*`` (which a write cannot use) is ``invalid_argument`` naming the header.
    """
    if if_match is not None and if_none_match is not None:
        raise InvalidArgument("send If-Match or If-None-Match, not both", field="If-None-Match")
    if if_match is not None:
        if if_match.strip(" \t") == "*":
            return (versions.ANY,)
        return _entity_tags(if_match, "If-Match")
    if if_none_match is not None:
        if if_none_match.strip(" \t") != "*":
            raise InvalidArgument(
                "a write takes only If-None-Match: * (create only where there is none)",
                field="If-None-Match",
            )
        return (versions.ABSENT,)
    return None


class BodyTooLarge(InvalidArgument):
    """A request body over its route's bound: invalid_argument on the field "body", as HTTP 413."""

    status = 413


class BodyRequest(Protocol):
    """What ``check_body_size`` reads of a request: an HttpRequest, or the MCP lean path's
    request (``switchboard.asgi``), which builds no HttpRequest."""

    @property
    def method(self) -> str | None: ...

    @property
    def body(self) -> bytes: ...

    @property
    def headers(self) -> Mapping[str, str]: ...


def check_body_size(request: BodyRequest, limit: int) -> None:
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


def unknown_parameter(name: str, takes: str) -> InvalidArgument:
    """A query parameter the operation does not take (``takes``: those it does, or "none")."""
    if not name:
        return InvalidArgument(
            f"query: a parameter has no name (this operation takes {takes})", field="query"
        )
    return InvalidArgument(
        f"{name}: not a query parameter of this operation (it takes {takes})", field=name
    )


def unwanted_body(body: bytes, query: Collection[str]) -> InvalidArgument | None:
    """The refusal of a body sent to an operation that takes none (``query``: the parameters it
    takes instead), or None for no body: nothing, white space or an empty JSON object, which
    say nothing (clients that always send a JSON body send ``{}``)."""
    text = body.strip()
    if not text or text == b"{}":
        return None
    try:
        value = validation.json_loads(text)
    except (ValueError, UnicodeDecodeError, RecursionError):
        value = None
    if isinstance(value, dict) and value:
        key = next(iter(value))
        name = "body" if not key or validation.text_problem(key) else key
        where = f"; give it in the query, ?{name}=" if name in query else ""
        return InvalidArgument(f"{name}: this operation takes no body{where}", field=name)
    if isinstance(value, dict):  # {} spelt with white space inside
        return None
    return InvalidArgument("body: this operation takes no body", field="body")


def error_response(request: HttpRequest, exc: DomainError) -> HttpResponse:
    response = json_response(exc.as_dict(), status=exc.status)
    seconds = retry_after_seconds(exc)
    if seconds is not None:
        response["Retry-After"] = str(seconds)
    if exc.status == 401:
        response["WWW-Authenticate"] = 'Bearer realm="switchboard"'
    return response


# Where ``bounded`` leaves a body it has parsed and checked (so it is parsed once), or why it
# refused it: the refusal is answered when the view reads the body, after authentication, so an
# agent without the verb still hears 403 first.
PARSED_BODY = "_switchboard_json"
# The bodies the API refuses by their type: it reads JSON (a page's form is the middleware's).
FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")
REFUSED_BODY = "_switchboard_json_refused"


def check_request(request: HttpRequest) -> None:
    """The edge check of a request's JSON body (the path, query and form fields are checked by
    ``switchboard.middleware``): parsed once, strictly (``switchboard.core.validation``)."""
    if request.method not in ("POST", "PUT", "PATCH", "DELETE") or not request.body:
        return
    kind = request.content_type or ""
    if kind in ("application/json", "", "text/plain") or kind.endswith("+json"):
        try:
            setattr(request, PARSED_BODY, validation.loads(request.body))
        except InvalidArgument as exc:
            setattr(request, REFUSED_BODY, exc)


class EdgeParser(Parser):
    """ninja's body parser, reading what the edge check already parsed (``bounded``)."""

    def parse_body(self, request: HttpRequest) -> Any:
        refused = getattr(request, REFUSED_BODY, None)
        if refused is not None:
            raise refused  # ninja turns it into HttpError(400); the API answers it as is
        if hasattr(request, PARSED_BODY):
            return getattr(request, PARSED_BODY)
        if request.content_type in FORM_TYPES:
            # A form is refused whatever its bytes: read as JSON, a form whose bytes happened
            # to be JSON was taken.
            refused = InvalidArgument(
                f"body: the API reads JSON, not a form ({request.content_type})", field="body"
            )
            setattr(request, REFUSED_BODY, refused)
            raise refused
        try:
            return validation.loads(request.body)
        except InvalidArgument as exc:
            setattr(request, REFUSED_BODY, exc)
            raise


def bounded(view: Callable[..., HttpResponse], limit: int = API_BODY_LIMIT) -> Any:
    """A view that refuses oversized bodies before anything else reads them, and checks a JSON
    body at the edge."""

    @wraps(view)
    def guarded(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        try:
            check_body_size(request, limit)
            check_request(request)
        except BodyTooLarge as exc:
            return error_response(request, exc)
        return view(request, *args, **kwargs)

    return guarded


def field_name(loc: list[Any] | tuple[Any, ...]) -> str:
    """Pydantic's error location without the request part: ("body", "payload", "window", "tz")
    → "window.tz"."""
    parts = list(loc)
    if parts and parts[0] in ("body", "query", "path", "header", "cookie", "form"):
        parts = parts[1:]
    if parts and parts[0] in ("payload", "body", "data"):
        parts = parts[1:]
    return field_path(parts) or "body"
