"""One validation at the edge for every string and JSON value a client sends.

Every surface calls these before anything is stored: the REST API (``switchboard.core.http`` checks
each JSON body once, before ninja's models see it), MCP tool arguments (``switchboard.core.verbs``),
the CLI and the admin and page forms (the services and the model fields call them again, so a
caller that skips the edge still cannot store what the edge refuses).

What is refused, each as ``invalid_argument`` naming the field (dotted path into JSON):

* a NUL character (PostgreSQL stores neither ``\\u0000`` in ``text`` nor in ``jsonb``);
* a lone surrogate (``\\ud800``): not encodable as UTF-8, so not storable;
* a non-finite number: ``NaN``, ``Infinity``, ``-Infinity`` and literals that overflow a double
  (``1e309``); JSON has no such values and ``jsonb`` refuses them;
* JSON nested deeper than ``MAX_JSON_DEPTH`` levels, or a stored JSON field (``payload``,
  ``result``, ``error``) larger than ``MAX_JSON_BYTES`` once serialised.

Names (queues, slugs) are matched against the whole string: ``re.fullmatch`` (Python's ``$``
also matches before a trailing newline).

Reading back is defensive too: ``renderable`` tells whether a stored JSON value can be shown,
so a row written behind the services' back never breaks a listing or a claim.
"""

from __future__ import annotations

import functools
import json
import math
import re
import sys
import types
from collections.abc import Iterator
from typing import Annotated, Any, Union, get_args, get_origin

from switchboard.core.errors import InvalidArgument, field_path

# Nesting bound of any JSON a client sends (the body itself is level 1, so a payload may nest
# MAX_JSON_DEPTH - 2 levels inside a verb's arguments). Deep enough for real documents; far below
# Python's recursion limit and pydantic's serialisation limit (255).
MAX_JSON_DEPTH = 64
# A stored JSON field (payload, result, error) nests at most this deep, whichever surface sends
# it: an MCP tools/call carries it three levels down (message, params, arguments), so any value
# one surface stores another can carry back (the CLI stored 64 levels, which REST and MCP then
# refused).
MAX_STORED_JSON_DEPTH = MAX_JSON_DEPTH - 3
# One stored JSON field (payload, result, error) serialised; the whole body is bounded at 1 MiB.
MAX_JSON_BYTES = 256 * 1024


class Refused(ValueError):
    """A value that cannot be stored; ``path`` is its location below the field."""

    def __init__(self, path: tuple[str | int, ...], reason: str) -> None:
        super().__init__(reason)
        self.path = path
        self.reason = reason


# The characters ``str.strip()`` takes off (those ``str.isspace()`` calls whitespace), spelled
# out as a class for the document's patterns. Not ``\s``: a JSON Schema pattern is an ECMA-262
# expression, whose ``\s`` leaves out U+001C-U+001F and U+0085, which strip() takes off, and
# takes in U+FEFF, which strip() keeps (a claimant of "\x1f" was valid by the document and
# refused as blank).
SPACE_CLASS = r"\t\n\x0b\x0c\r\x1c-\x1f \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"

# The NUL rule as a pattern, for the OpenAPI document's strings (``switchboard.api``); and with
# it, for a text the services keep stripped (a name, a title, a reason), not blank either.
NO_NUL_RE = r"^[^\x00]*$"
NOT_BLANK_RE = rf"^[^\x00]*[^{SPACE_CLASS}\x00][^\x00]*$"


def text_problem(value: str) -> str | None:
    """Why this string cannot be stored, or None."""
    if "\x00" in value:
        return "must not contain a NUL character (\\u0000)"
    if value.isascii():  # a flag of the string: no lone surrogate, and no copy made to know it
        return None
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "must not contain a lone surrogate (\\ud800-\\udfff)"
    return None


def _walk(value: Any, max_depth: int) -> Iterator[Refused]:
    """Every problem in a JSON-like value, depth-first; iterative, so depth cannot blow the stack."""
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(value, ())]
    while stack:
        item, path = stack.pop()
        if len(path) >= max_depth and isinstance(item, dict | list):
            yield Refused(path, f"is nested deeper than {max_depth} levels")
            continue
        if isinstance(item, str):
            problem = text_problem(item)
            if problem:
                yield Refused(path, problem)
        elif isinstance(item, float):
            if not math.isfinite(item):
                yield Refused(path, "must be a finite number (no NaN, Infinity or overflow)")
        elif isinstance(item, dict):
            for key, child in reversed(list(item.items())):
                if isinstance(key, str):
                    problem = text_problem(key)
                    if problem:
                        yield Refused((*path, key.encode("utf-8", "replace").decode()), problem)
                        continue
                stack.append((child, (*path, str(key))))
        elif isinstance(item, list | tuple):
            for index in reversed(range(len(item))):
                stack.append((item[index], (*path, index)))


# The scalars a flat object may hold with nothing to check (a float is checked: NaN, Infinity).
_PLAIN_SCALARS = (int, bool, type(None))


def _flat_and_clean(value: Any) -> bool:
    """Whether ``value`` is an object of plain scalars with nothing ``_walk`` would refuse: the
    shape of almost every verb's arguments and of most payloads, checked without the walk's
    stack and paths (issue 11: two to five walks per claim cycle). False is not a refusal: the
    walk then finds the problem, if there is one, and names it."""
    if type(value) is not dict:
        return False
    for key, item in value.items():
        if type(key) is not str or text_problem(key) is not None:
            return False
        kind = type(item)
        if kind is str:
            if text_problem(item) is not None:
                return False
        elif kind is float:
            if not math.isfinite(item):
                return False
        elif kind not in _PLAIN_SCALARS:
            return False  # a container, or a subclass: the walk decides
    return True


def dotted(field: str, path: tuple[str | int, ...]) -> str:
    """The name of a value at ``path`` below ``field``, as every refusal names it
    (``errors.field_path``: ``payload.items.3``, ``windows[1].tz``)."""
    parts = [p if isinstance(p, int) else p.replace("\x00", "\\u0000") for p in (field, *path)]
    return field_path([p for p in parts if p != ""]) or "body"


def refusal(field: str, problem: Refused) -> InvalidArgument:
    name = dotted(field, problem.path)
    return InvalidArgument(f"{name}: {problem.reason}", field=name)


def check_text(value: Any, field: str) -> Any:
    """Refuse a string that cannot be stored (None and non-strings pass through untouched)."""
    if isinstance(value, str):
        problem = text_problem(value)
        if problem:
            raise InvalidArgument(f"{field}: {problem}", field=field)
    return value


def check_json(
    value: Any, field: str, *, max_depth: int = MAX_JSON_DEPTH, max_bytes: int | None = None
) -> Any:
    """Refuse JSON that cannot be stored: NUL, lone surrogates, non-finite numbers, too deep,
    and (with ``max_bytes``) too large. Returns the value."""
    if max_depth < 1 or not _flat_and_clean(value):
        for problem in _walk(value, max_depth):
            raise refusal(field, problem)
    if max_bytes is not None:
        size = len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())
        if size > max_bytes:
            raise InvalidArgument(
                f"{field}: is {size} bytes as JSON; the limit is {max_bytes}",
                field=field,
                limit=max_bytes,
                size=size,
            )
    return value


def check_stored_json(value: Any, field: str) -> Any:
    """A JSON field about to be stored (payload, result, error): the bounds in the README."""
    if value is None:  # nothing to walk or measure (most completions send no result)
        return None
    return check_json(value, field, max_depth=MAX_STORED_JSON_DEPTH, max_bytes=MAX_JSON_BYTES)


def loads(raw: bytes | str, field: str = "") -> Any:
    """Parse a client's JSON strictly: what ``json.loads`` accepts beyond JSON (NaN, Infinity,
    overflowing literals) is refused, and so is anything ``check_json`` refuses.

    Raises ``InvalidArgument`` naming the field (a path below ``field``; a request body's
    problems name its keys); a body that is not JSON at all names ``body``.
    """
    name = field or "body"
    try:
        # NaN and Infinity parse as floats here; the walk below refuses them with their path.
        value = json_loads(raw)
    except NotClientJson as exc:
        raise InvalidArgument(f"{name}: {exc}", field=name) from None
    except RecursionError:
        raise InvalidArgument(
            f"{name}: is nested deeper than {MAX_JSON_DEPTH} levels", field=name
        ) from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidArgument(f"{name}: is not valid JSON ({not_json(exc)})", field=name) from None
    return check_json(value, field)


def not_json(exc: ValueError) -> str:
    """Why the parser refused a body, in the client's terms: Python's advice on its integer
    limit ("use sys.set_int_max_str_digits()") is not the client's to take."""
    why = str(exc)
    if "integer string conversion" in why:
        return f"a number has more than {sys.get_int_max_str_digits()} digits"
    return why


class NotClientJson(ValueError):
    """A body ``json.loads`` reads that a client's JSON must not be: UTF-16 or UTF-32 (RFC 8259
    8.1: JSON exchanged between systems is UTF-8), or an object giving one name twice (read, it
    keeps the last value, where a proxy or a validator in front may act on the first)."""


def _each_name_once(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    value = dict(pairs)
    if len(value) != len(pairs):
        seen: set[str] = set()
        for name, _ in pairs:
            if name in seen:
                shown = json.dumps(name if len(name) <= 64 else name[:64] + "…")
                raise NotClientJson(f"gives the name {shown} twice in one object; give it once")
            seen.add(name)
    return value


_CLIENT_DECODER = json.JSONDecoder(object_pairs_hook=_each_name_once)
_CLIENT_SCAN = _CLIENT_DECODER.scan_once  # type: ignore[attr-defined]
_CLIENT_DECODE = _CLIENT_DECODER.decode


def json_loads(raw: bytes | str) -> Any:
    """A client's JSON: ``json.loads(raw)`` (the same value, or the same error) but that bytes
    in UTF-16 or UTF-32, which ``json.loads`` detects and reads, and an object giving a name
    twice are refused (``NotClientJson``). A body as clients send it (bytes opening with ``{``
    and no NUL in the first four) is decoded and scanned at once, without ``json.loads``'
    encoding detection and whitespace matching: a few µs of every agent request (issue 11).
    Anything else, and bytes that are not strict UTF-8 (``json.loads`` lets encoded surrogates
    through), go through ``json.loads``."""
    if isinstance(raw, bytes):
        if raw[:1] == b"{" and 0 not in raw[:4]:
            try:
                text = raw.decode()
            except UnicodeDecodeError:
                return json.loads(raw, object_pairs_hook=_each_name_once)
            return _decode(text, _CLIENT_SCAN, _CLIENT_DECODE)
        # What json.loads reads as UTF-16 or UTF-32: a NUL among the first four bytes (JSON
        # text opens with an ASCII character, and holds no NUL in UTF-8), or their marks.
        if 0 in raw[:4] or raw[:2] in (b"\xff\xfe", b"\xfe\xff"):
            raise NotClientJson("is not UTF-8 (RFC 8259: JSON between systems is UTF-8)")
    return json.loads(raw, object_pairs_hook=_each_name_once)


def renderable(value: Any) -> bool:
    """Whether a stored JSON value can be shown to a client (defence against rows written
    behind the services' back: too deep, or holding what JSON cannot say)."""
    return _flat_and_clean(value) or next(_walk(value, MAX_JSON_DEPTH), None) is None


def fullmatch(pattern: str, value: Any) -> bool:
    """A name check against the whole string (``$`` alone accepts a trailing newline)."""
    return isinstance(value, str) and re.fullmatch(pattern, value) is not None


class SafeJSONDecoder(json.JSONDecoder):
    """Reads stored JSON for the model fields without ever raising on what ``jsonb`` holds and
    Python cannot read: a value too deep for Python's parser, or an integer longer than Python
    converts (``jsonb`` keeps ``1e5000`` and writes it out as 5,001 digits). Either comes back
    as ``UNREADABLE`` so its row can still be listed."""

    def decode(self, s: str, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().decode(s, *args, **kwargs)
        except (RecursionError, ValueError):
            return dict(UNREADABLE)


def stored_json_loads(data: bytes | bytearray | memoryview | str) -> Any:
    """psycopg's json/jsonb loader: ``json.loads``, or ``UNREADABLE`` for a value Python cannot
    read (too deep, or an integer too long: see ``SafeJSONDecoder``).

    The database sends UTF-8 (Django sets the client encoding): decoded as such and parsed
    with a plain decoder, without ``json.loads``' encoding detection (a claim cycle loads two
    or three values: issue 12); anything else goes through ``json.loads``."""
    try:
        if not isinstance(data, str):
            try:
                data = bytes(data).decode()
            except UnicodeDecodeError:
                return json.loads(bytes(data))  # type: ignore[arg-type]
        return _decode(data)
    except (RecursionError, ValueError):
        return dict(UNREADABLE)


# What json.loads(text) runs with no options given.
_DECODER = json.JSONDecoder()
_DECODE = _DECODER.decode
_SCAN = _DECODER.scan_once  # type: ignore[attr-defined]


def _decode(text: str, scan: Any = _SCAN, decode: Any = _DECODE) -> Any:
    """``decode(text)``, the scanner called at once when ``text`` is one value with nothing
    around it (as PostgreSQL writes one); anything else (whitespace, extra data) goes through
    ``decode``, which answers or raises as it always does."""
    try:
        value, end = scan(text, 0)
    except StopIteration:
        return decode(text)
    return value if end == len(text) else decode(text)


# What a stored value that cannot be read or shown is replaced with on every surface.
UNREADABLE = {
    "unreadable": f"stored JSON nested deeper than {MAX_JSON_DEPTH} levels, or holding a number"
    " too long to read"
}


def shown(value: Any) -> Any:
    """A stored JSON value as clients see it: itself, or ``UNREADABLE`` when it cannot be
    rendered (so one bad row does not break a page of todos or a claim)."""
    if value is None:  # nothing to walk: a claim's result, a todo with no payload
        return None
    return value if renderable(value) else dict(UNREADABLE)


def validate_stored_json(value: Any) -> None:
    """Django model-field validator (the admin's forms call it through ``full_clean``)."""
    from django.core.exceptions import ValidationError

    try:
        check_stored_json(value, "value")
    except InvalidArgument as exc:
        raise ValidationError(exc.message) from None


def validate_text(value: Any) -> None:
    from django.core.exceptions import ValidationError

    if isinstance(value, str) and text_problem(value):
        raise ValidationError(f"this {text_problem(value)}")


def integral_numbers(model: Any, values: Any) -> Any:
    """``values`` (an input object) with each number of an integer-only field that has no
    fraction as an int: JSON Schema's ``integer``, which the tools' and the OpenAPI's schemas
    declare, is any number with no fraction, ``2.0`` as well as ``2`` (a client computing a
    lease in floating point sends one). The strict models refuse a float for an int, and
    anything else as before: ``2.5``, ``"2"``, ``true``."""
    if type(values) is not dict:
        return values
    names = _integral_fields(model)
    if not names:
        return values
    changed: dict[str, Any] | None = None
    for name in names:
        value = values.get(name)
        if type(value) is float and value.is_integer():
            if changed is None:
                changed = dict(values)
            changed[name] = int(value)
    return values if changed is None else changed


@functools.cache
def _integral_fields(model: Any) -> tuple[str, ...]:
    """The fields (by the key a client sends) of a pydantic model that take an int and no
    other number."""
    return tuple(
        info.alias or name
        for name, info in model.model_fields.items()
        if _number_types(info.annotation) == {int}
    )


def _number_types(annotation: Any) -> set[type]:
    """The number types an annotation takes (through unions, ``Optional`` and ``Annotated``)."""
    if annotation in (int, float):
        return {annotation}
    found: set[type] = set()
    for arg in get_args(annotation) if get_origin(annotation) in _WRAPPERS else ():
        found |= _number_types(arg)
    return found


_WRAPPERS = (Union, types.UnionType, Annotated)
