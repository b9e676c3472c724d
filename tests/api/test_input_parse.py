"""A verb's input is validated once (issue 11: every agent request's CPU). ninja Schema's wrapping
validator validates a model that forbids extra keys twice, the second time through a DjangoGetter
(attribute access, for ORM objects), running each field's own validators again; the inputs'
``Strict`` bases (queues.schemas, admission.schemas) replace it with one plain pass."""

from __future__ import annotations

import json
from typing import Any, get_args
from uuid import uuid4

import pytest
from pydantic import BaseModel

from switchboard.core import validation, verbs
from switchboard.core.errors import InvalidArgument


def test_a_stored_json_argument_is_checked_once(monkeypatch: pytest.MonkeyPatch) -> None:
    checked: list[str] = []
    real = validation.check_stored_json

    def counting(value: Any, field: str) -> Any:
        checked.append(field)
        return real(value, field)

    monkeypatch.setattr(validation, "check_stored_json", counting)
    data: Any = verbs.load_verbs()["complete"].parse({"id": str(uuid4()), "result": {"a": [1]}})
    assert data.result == {"a": [1]} and checked == ["result"]


def test_every_strict_input_is_validated_in_one_pass() -> None:
    strict = [
        spec.input
        for spec in verbs.load_verbs().values()
        if spec.input.model_config.get("strict")
        and spec.input.model_config.get("extra") == "forbid"
    ]
    assert len(strict) > 10
    for model in strict:
        root = model.__pydantic_decorators__.model_validators["_run_root_validator"]
        assert root.func.__qualname__ == "Strict._run_root_validator", model.__name__


def test_the_refusals_still_name_the_field() -> None:
    spec = verbs.load_verbs()["complete"]
    for arguments, field in [
        ({"id": "x"}, "id"),
        ({"id": str(uuid4()), "surprise": 1}, "surprise"),
        ({"id": str(uuid4()), "attempt": "1"}, "attempt"),
    ]:
        with pytest.raises(InvalidArgument) as refused:
            spec.parse(arguments)
        assert refused.value.field == field, refused.value


def _outcome(parse: Any, raw: bytes | str) -> Any:
    try:
        return ("value", parse(raw))
    except Exception as exc:
        return (type(exc), str(exc))


BODIES: list[bytes | str] = [
    b'{"id": "x", "n": [1, 2.5, -0.0, 1e400, NaN], "t": "caf\xc3\xa9 \\u2028"}',
    b"{}",
    b'{"a": 1} ',  # trailing whitespace
    b' {"a": 1}',  # leading whitespace
    b'{"a": 1}{"b": 2}',  # extra data
    b'{"a": 1,}',
    b'{"a": "\xed\xa0\x80"}',  # an encoded surrogate: json.loads lets it through
    b'{"a": "\xff"}',  # not UTF-8
    b"\xef\xbb\xbf{}",  # a UTF-8 BOM
    b'{"a": {"b": 1}, "c": [{"d": 2}]}',
    b"{" * 100_000,  # too deep: RecursionError
    b"{",
    b"",
    b"[1]",
    '{"a": "é"}',
]


@pytest.mark.parametrize("raw", BODIES)
def test_a_body_is_read_as_json_loads_reads_it(raw: bytes | str) -> None:
    """``validation.json_loads`` (bodies opening with ``{`` scanned at once) answers what
    ``json.loads`` answers: the same value, or the same error and message."""
    assert _outcome(validation.json_loads, raw) == _outcome(json.loads, raw)


NOT_CLIENT_JSON: list[bytes | str] = [
    '{"a": 1}'.encode("utf-16-le"),  # json.loads reads these four
    '{"a": 1}'.encode("utf-16"),
    '{"a": 1}'.encode("utf-32-be"),
    b"{\x00}",
    b'{"a": 1, "a": 1}',  # json.loads keeps the last value of a name given twice
    b' {"a": 1, "a": 2}',
    b'{"a": "\xed\xa0\x80", "a": 2}',  # an encoded surrogate: json.loads' own path
    b'[{"b": [{"c": 1, "c": 2}]}]',
    '{"é": 1, "é": 2}',
]


@pytest.mark.parametrize("raw", NOT_CLIENT_JSON)
def test_utf16_utf32_and_a_name_given_twice_are_refused(raw: bytes | str) -> None:
    with pytest.raises(validation.NotClientJson):
        validation.json_loads(raw)
    with pytest.raises(InvalidArgument) as refused:
        validation.loads(raw)
    assert refused.value.field == "body"


# A flat object (every verb's arguments, most payloads) is checked without the walk; each of
# these is refused by the walk all the same, naming the same field.
FLAT_REFUSED: list[tuple[dict[Any, Any], str]] = [
    ({"id": "x", "title": "a\x00b"}, "args.title"),
    ({"title": "\ud800"}, "args.title"),
    ({"ok": 1, "a\x00": 2}, "args.a\\u0000"),
    ({"\udc80": 1}, "args.?"),
    ({"n": float("nan")}, "args.n"),
    ({"n": 1, "m": float("-inf")}, "args.m"),
]


@pytest.mark.parametrize(("value", "field"), FLAT_REFUSED)
def test_a_flat_object_is_refused_as_the_walk_refuses_it(value: dict[Any, Any], field: str) -> None:
    with pytest.raises(InvalidArgument) as refused:
        validation.check_json(value, "args")
    assert refused.value.details["field"] == field
    assert not validation.renderable(value)
    assert validation.shown(value) == validation.UNREADABLE


@pytest.mark.parametrize(
    "value", [{}, {"id": str(uuid4()), "n": 1, "f": 2.5, "b": True, "none": None, "é": "ü"}]
)
def test_a_clean_flat_object_passes(value: dict[str, Any]) -> None:
    assert validation.check_json(value, "args") is value
    assert validation.renderable(value) and validation.shown(value) is value
    with pytest.raises(InvalidArgument):  # no depth at all allowed: even a flat object is deep
        validation.check_json(value, "args", max_depth=0)


def _body_models() -> list[tuple[str, type[BaseModel]]]:
    import switchboard.urls  # noqa: F401  (mounts every router on the one NinjaAPI)
    from switchboard.api import api

    found = []
    for prefix, router in api._routers:
        for path, operations in router.path_operations.items():
            for operation in operations.operations:
                for params in operation.models:
                    if getattr(params, "__ninja_param_source__", None) != "body":
                        continue
                    for field in params.model_fields.values():
                        for model in (field.annotation, *get_args(field.annotation)):
                            if isinstance(model, type) and issubclass(model, BaseModel):
                                found.append((f"{operation.methods} {prefix}{path}", model))
    return found


def test_every_request_body_refuses_unknown_keys_and_coercion() -> None:
    # A pause's body was lax: {"reason": "x", "craete": true} paused without the flag, and
    # "create": "yes" read as true.
    bodies = _body_models()
    assert len(bodies) >= 20
    for where, model in bodies:
        assert model.model_config.get("extra") == "forbid", (where, model.__name__)
        assert model.model_config.get("strict") is True, (where, model.__name__)
