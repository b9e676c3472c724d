"""The agent verb registry: each verb declared once, served as REST and as an MCP tool.

Both surfaces are generated from ``REGISTRY``, so they cannot disagree:

* REST: ``POST /api/v1/agent/<name>`` with the input as the JSON body (``queues/api.py``);
* MCP: ``tools/list`` shows the verbs the endpoint holds, ``tools/call`` runs them
  (``switchboard/mcp.py``).

Declaring a verb (as ``admission/verbs.py`` does)::

    from ninja import Schema
    from switchboard.core.verbs import verb

    class AdmissionStatusIn(Schema):          # any pydantic BaseModel (ninja Schema is one)
        model_config = ConfigDict(extra="forbid")
        queue: str | None = None

    class AdmissionStatusOut(Schema):
        queues: list[QueueAdmission]

    @verb(
        "admission_status",                   # the wire name; must be a queues.models.Verb value
        input=AdmissionStatusIn,              # validates REST bodies and MCP arguments alike
        output=AdmissionStatusOut,            # documents REST 200 and MCP outputSchema
        description="What admission says about each granted queue, and why.",
        errors=(404,),                        # extra HTTP statuses this verb can answer (optional)
    )
    def admission_status(actor: AgentActor, data: AdmissionStatusIn) -> dict[str, Any]:
        return {"queues": [...]}               # JSON-able, matching the output schema

The contract of a handler ``fn(actor, data) -> dict``:

* ``actor`` is the authenticated agent actor; ``actor.via`` is ``"api"`` or
  ``"mcp"``. The grant is already checked (``actor.endpoint.holds(name)``) when ``fn`` runs; a
  refused grant is ``Forbidden`` (403 on REST, an ``isError`` tool result on MCP).
* ``data`` is an instance of the input model, already validated: a bad body never reaches ``fn``
  (REST answers 400 ``invalid_argument`` naming the field; MCP an ``isError`` result with the
  same object).
* Refusals are ``switchboard.core.errors.DomainError`` subclasses; both surfaces map them once.
* The returned dict is validated against the output model and dumped with
  ``exclude_unset=True``, so optional keys you leave out stay out (``lease_token?``), and keys
  you set to ``None`` appear as ``null``. Datetimes may be ``datetime`` objects or ISO strings.

Every route answers 400/401/403/429/503 (and 413 for an oversized body); list any other status the
handler can raise in ``errors`` (e.g. 404 ``not_found``, 409 ``conflict``/``deferred``, 503
``admission_unavailable``) so the OpenAPI document stays true.

Loading: each app imports its verb module from its ``AppConfig.ready()`` (``queues`` first, so
its verbs come first); ``load_verbs()`` returns the registry once Django is set up.
Declaring the same name twice raises ``ImproperlyConfigured``.

Reading it: ``REGISTRY`` maps name → ``VerbSpec(name, input, output, description, fn, errors)``;
``granted(actor)`` lists the specs the endpoint holds; ``get(name)``; ``call(actor, spec, data)``
checks the grant, runs ``fn`` and renders the output (``call_json``: as JSON text);
``spec.parse(arguments)`` validates raw arguments (``InvalidArgument`` naming the field);
``spec.input_schema()`` / ``spec.output_schema()`` give the JSON Schemas (cached; do not mutate
them).
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeVar, Union, get_args, get_origin

from django.core.exceptions import ImproperlyConfigured
from pydantic import BaseModel, ConfigDict, ValidationError, create_model
from pydantic.fields import FieldInfo

from switchboard.core.errors import Forbidden, InvalidArgument, field_path
from switchboard.core.validation import check_json

# The statuses every agent route can answer, whatever the verb (503: a dependency did not answer
# in time, switchboard.core.availability).
COMMON_ERRORS = (400, 401, 403, 413, 429, 503)


class AgentActor(Protocol):
    """What the registry needs of the acting agent (the access layer's agent actor fits):
    its endpoint, which says which verbs it holds."""

    @property
    def endpoint(self) -> Any: ...


Handler = Callable[[Any, Any], dict[str, Any]]
F = TypeVar("F", bound=Handler)


@dataclass(frozen=True)
class Hints:
    """What a verb does to the world, told to MCP hosts as the tool's annotations (a host may
    run a read-only tool without asking its human, and ask before a destructive one). The
    defaults are the cautious answer only where it is true: a verb writes, additively, and a
    second call with the same arguments may do more."""

    read_only: bool = False
    # Replaces or removes what someone set (a budget), rather than adding or moving work.
    destructive: bool = False
    # A second call with the same arguments changes nothing more.
    idempotent: bool = False

    def annotations(self) -> dict[str, bool]:
        """MCP's ``ToolAnnotations``: every verb acts on this Switchboard only (a closed world);
        destructive and idempotent mean something only for a verb that writes."""
        if self.read_only:
            return {"readOnlyHint": True, "openWorldHint": False}
        return {
            "readOnlyHint": False,
            "destructiveHint": self.destructive,
            "idempotentHint": self.idempotent,
            "openWorldHint": False,
        }


@dataclass(frozen=True)
class VerbSpec:
    name: str
    input: type[BaseModel]
    output: type[BaseModel]
    description: str
    fn: Handler
    errors: tuple[int, ...] = ()
    hints: Hints = Hints()

    @property
    def statuses(self) -> tuple[int, ...]:
        """Every error status the REST route may answer, sorted."""
        return tuple(sorted(set(COMMON_ERRORS) | set(self.errors)))

    def input_schema(self) -> dict[str, Any]:
        """The input as JSON Schema (MCP ``inputSchema``; the REST body is the same model).
        Cached: treat it as read-only."""
        return _json_schema(self.input, "validation")

    def output_schema(self) -> dict[str, Any]:
        return _json_schema(self.output, "serialization")

    def parse(self, arguments: Any) -> BaseModel:
        """Validate raw arguments; a failure is ``invalid_argument`` naming the first field."""
        arguments = arguments if arguments is not None else {}
        # The edge check (NUL, lone surrogates, non-finite numbers, depth): REST bodies had it
        # when parsed; MCP arguments get it here, for every tool alike.
        check_json(arguments, "")
        try:  # model_validate, without its Python-level wrapper
            return self.input.__pydantic_validator__.validate_python(arguments)
        except ValidationError as exc:
            raise invalid_argument(exc) from None

    def render(self, result: dict[str, Any]) -> dict[str, Any]:
        """The handler's answer as JSON, checked against the output model (its plain twin)."""
        return (
            plain_model(self.output)
            .model_validate(result)
            .model_dump(mode="json", by_alias=True, exclude_unset=True)
        )

    def render_json(self, result: dict[str, Any]) -> bytes:
        """``render``'s answer as JSON text, checked the same way, written by pydantic's own
        encoder from the checked model: no dict of JSON values made and walked again by
        ``json.dumps`` (issue 11: that round trip cost more than the check). Compact and
        ASCII-only, as ``json.dumps(render(result), separators=(",", ":"))`` writes it, but for
        a float below 1e-4, written without Python's exponent padding (``1.5e-7``, the same
        number). The REST verbs answer with it.

        Written first without ``ensure_ascii``, which only escapes what is beyond ASCII and
        costs a tenth of the call: an answer that came out ASCII (almost every one) is what
        ``ensure_ascii`` would have written; any other is written again with it."""
        twin = plain_model(self.output)
        # twin.model_validate(result), without its Python-level wrapper.
        checked = twin.__pydantic_validator__.validate_python(result)
        serializer = twin.__pydantic_serializer__
        content: bytes = serializer.to_json(checked, by_alias=True, exclude_unset=True)
        if content.isascii():
            return content
        return serializer.to_json(checked, by_alias=True, exclude_unset=True, ensure_ascii=True)


# The validators a plain twin may leave out: ninja Schema's, which wraps the values of every
# nested model in a DjangoGetter (attribute access, Django managers and files) for ORM objects.
_TWIN_DROPS = frozenset({"_run_root_validator"})


@functools.cache
def plain_model(model: type[BaseModel]) -> type[BaseModel]:
    """``model`` with the same fields, types, defaults and aliases, nested models likewise, but
    none of ninja Schema's wrapping validator: what it adds is for ORM objects, and a verb's
    handler answers a dict of plain values. Checking the answer of a claim against it cost
    7 times the twin's (issue 11: ~8 % of an agent request's CPU). A model with any validator,
    serializer, computed field or resolver of its own is kept as it is (nested ones too).
    """
    decorators = model.__pydantic_decorators__
    own = (
        decorators.validators,
        decorators.field_validators,
        decorators.root_validators,
        decorators.field_serializers,
        decorators.model_serializers,
        decorators.computed_fields,
    )
    if any(own) or set(decorators.model_validators) - _TWIN_DROPS:
        return model
    if getattr(model, "_ninja_resolvers", None):
        return model
    fields: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        annotation = _plain_annotation(info.annotation)
        fields[name] = (annotation, FieldInfo.merge_field_infos(info, annotation=annotation))
    return create_model(
        model.__name__,
        __config__=ConfigDict(**model.model_config),
        __doc__=model.__doc__,
        **fields,
    )


def _plain_annotation(annotation: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return plain_model(annotation)
    origin = get_origin(annotation)
    if origin in (list, dict, tuple, set, frozenset):
        return origin[tuple(_plain_annotation(a) for a in get_args(annotation))]
    if origin in (types.UnionType, Union):
        return Union[tuple(_plain_annotation(a) for a in get_args(annotation))]  # noqa: UP007
    return annotation  # Literal, Annotated and the rest as they are


@functools.cache
def _json_schema(model: type[BaseModel], mode: Literal["validation", "serialization"]) -> Any:
    return model.model_json_schema(mode=mode)


REGISTRY: dict[str, VerbSpec] = {}


def verb(
    name: str,
    *,
    input: type[BaseModel],
    output: type[BaseModel],
    description: str,
    errors: tuple[int, ...] = (),
    hints: Hints | None = None,
) -> Callable[[F], F]:
    """Declare an agent verb; see the module docstring for the handler contract."""

    def register(fn: F) -> F:
        if name in REGISTRY:
            raise ImproperlyConfigured(f"agent verb {name!r} is declared twice")
        REGISTRY[name] = VerbSpec(
            name=name,
            input=input,
            output=output,
            description=description.strip(),
            fn=fn,
            errors=tuple(errors),
            hints=hints or Hints(),
        )
        return fn

    return register


def load_verbs() -> dict[str, VerbSpec]:
    """Every declared verb, in declaration order. Each app declares its verbs from its
    ``AppConfig.ready()``, so the registry is complete once Django is set up."""
    return REGISTRY


def get(name: str) -> VerbSpec | None:
    return load_verbs().get(name)


def granted(actor: AgentActor) -> list[VerbSpec]:
    """The verbs this endpoint holds, in declaration order."""
    return [spec for spec in load_verbs().values() if actor.endpoint.holds(spec.name)]


def check_grant(actor: AgentActor, name: str) -> None:
    if not actor.endpoint.holds(name):
        raise Forbidden(
            f"this endpoint's grant does not include {name}; revoke it and vend a new one with "
            "that verb",
            verb=name,
        )


def call(actor: AgentActor, spec: VerbSpec, data: BaseModel) -> dict[str, Any]:
    """Run a verb for an agent: the grant, the handler, the output check."""
    check_grant(actor, spec.name)
    return spec.render(spec.fn(actor, data))


def call_json(actor: AgentActor, spec: VerbSpec, data: BaseModel) -> bytes:
    """``call``, answering the JSON text (``VerbSpec.render_json``): the REST verbs' body."""
    check_grant(actor, spec.name)
    return spec.render_json(spec.fn(actor, data))


def field_of(loc: Sequence[Any]) -> str:
    return field_path(list(loc)) or "body"


def invalid_argument(exc: ValidationError) -> InvalidArgument:
    """A pydantic failure as the one error shape: ``invalid_argument`` naming the field."""
    errors = exc.errors(include_url=False, include_context=False, include_input=False)
    first = errors[0] if errors else {"loc": (), "msg": "is invalid"}
    name = field_of(first.get("loc", ()))
    message = str(first.get("msg", "is invalid")).removeprefix("Value error, ")
    return InvalidArgument(
        f"{name}: {message}",
        field=name,
        errors=[
            {"field": field_of(e.get("loc", ())), "message": str(e.get("msg"))} for e in errors
        ],
    )
