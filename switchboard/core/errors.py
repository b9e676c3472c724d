"""One domain error hierarchy, mapped once to the API error shape and once to page messages."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class DomainError(Exception):
    """A refusal: a stable code (the API's ``code``), a human sentence and additive details."""

    code = "internal"
    status = 500

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details

    def as_dict(self) -> dict[str, Any]:
        return {"error": self.message, "code": self.code, **self.details}


class InvalidArgument(DomainError):
    code = "invalid_argument"
    status = 400

    def __init__(self, message: str, *, field: str, **details: Any) -> None:
        super().__init__(message, field=field, **details)
        self.field = field


class Unauthorized(DomainError):
    code = "unauthorized"
    status = 401


class Forbidden(DomainError):
    code = "forbidden"
    status = 403


class NotFound(DomainError):
    code = "not_found"
    status = 404


class MethodNotAllowed(DomainError):
    """A path answered for a method it does not take (the ``Allow`` header lists those it does)."""

    code = "method_not_allowed"
    status = 405


class Conflict(DomainError):
    code = "conflict"
    status = 409


class PreconditionFailed(DomainError):
    """A conditional write whose condition no longer holds: the thing changed since the caller
    read it (HTTP's If-Match / If-None-Match, the console's preview). Nothing was written."""

    code = "precondition_failed"
    status = 412


class Deferred(DomainError):
    """A claim refused by admission: wait until next_eligible_at, don't pick another todo."""

    code = "deferred"
    status = 409


class RateLimited(DomainError):
    code = "rate_limited"
    status = 429


# Lists whose items a refusal names by index in brackets (``windows[1].tz``, issue 12), as the
# services that validate them do; any other index stays dotted (``tags.1``).
BRACKETED_LISTS = frozenset({"windows"})
# The JSON a client stores as it is: a path inside one stays dotted whatever its keys are named.
STORED_FIELDS = frozenset({"payload", "result", "error"})


def field_path(parts: Sequence[str | int]) -> str:
    """A field's dotted path from its parts (a list's index an int, as pydantic's locations and
    the edge's JSON walk give it), an item of a bracketed list as ``name[i]``, except inside a
    stored field."""
    out: list[str] = []
    for part in parts:
        stored = bool(out) and out[0] in STORED_FIELDS
        if isinstance(part, int) and out and out[-1] in BRACKETED_LISTS and not stored:
            out[-1] = f"{out[-1]}[{part}]"
        else:
            out.append(str(part))
    return ".".join(out)
