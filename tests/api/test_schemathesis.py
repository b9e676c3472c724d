"""Schemathesis over /api/v1/openapi.json against a live server, as an agent and as an operator.

Every operation gets schema-valid and schema-invalid requests. Nothing may answer 5xx, answer a
status the document does not declare, or answer a body that violates the declared schema;
invalid requests must be refused (4xx), and valid ones not refused as invalid (400) but for the
rules no schema can state (``UNSTATED``). Bounded by a fixed number of examples per operation.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator
from pydantic import BaseModel
from schemathesis.checks import not_a_server_error
from schemathesis.core.result import Ok
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from admission.policy import _clean_window
from admission.selectors import SCOPE_RE, parse_scope
from queues import services
from queues.models import LIMIT_NAME_RE, QUEUE_NAME_RE, check_limit_name, check_queue_name
from switchboard.api import EVENT_STREAM, EVENTS_PATH
from switchboard.core import verbs
from switchboard.core.errors import InvalidArgument
from switchboard.core.http import IF_MATCH_RE, IF_NONE_MATCH_RE, write_preconditions
from switchboard.core.validation import NO_NUL_RE, NOT_BLANK_RE, SPACE_CLASS
from switchboard.core.zones import zone_exists, zones
from tests.api.conftest import human_token
from tests.conftest import Personas, push
from tests.mcp.conftest import NODE

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]
EXAMPLES = {schemathesis.GenerationMode.POSITIVE: 20, schemathesis.GenerationMode.NEGATIVE: 10}


# Refusals of schema-valid requests (400) for rules the document cannot state as a schema, each
# with why: (the field, how the error begins), both as regular expressions; a budget's fields are
# named under ``policy.`` in the agents' set_admission_policy. Any other 400 for a schema-valid
# request means the document calls valid what the server refuses: state the rule in the document
# (a pattern, an enum) or, where no schema can say it, add it here.
_POLICY = r"(?:policy\.)?"
_LIMIT_FIELDS = r"limit|slots|base_limit|floor|decay_step|decay_window_seconds"
UNSTATED = [
    # opaque: only the server's own cursors are cursors
    (r"cursor", r"cursor is not one this server gave out"),
    # a rule across two headers, which a parameter's schema cannot state
    (r"If-None-Match", r"send If-Match or If-None-Match, not both"),
    # a hook's host must be public, known only by resolving it; and urlsplit's own grammar
    (r"notify_url", r"notify_url is refused: "),
    # look-alike letters and invisible characters folded before the prefix is compared
    (r"claimant", r"claimant may not start with "),
    # who exists: an owner is a stored user's name
    (r"owner", r"no user named "),
    # rules across a budget's fields and across its windows (PolicyIn's description says them)
    (_POLICY + r"max_in_flight", r"a budget needs max_in_flight, max_claims_per_window, or both"),
    (_POLICY + r"window", r"max_claims_per_window needs a window"),
    (_POLICY + r"windows", r"give the window limits either as windows or as max_claims_"),
    (_POLICY + r"windows\[\d+\]\.period", r"windows\[\d+\] repeats an earlier window"),
    # one body for a pool, a tag and a rate limit: which fields a kind takes, needs and allows
    # depends on the path's kind; and a rate limit's floor is at most its base_limit
    (_LIMIT_FIELDS, r"\w+ is not a field of a (?:pool|tag|rate) limit"),
    (_LIMIT_FIELDS, r"\w+ is required$"),
    (_LIMIT_FIELDS, r"\w+ must be a whole number from "),
    (r"floor|base_limit", r"floor must not exceed base_limit"),
    (r"clear_aging", r"aging_seconds and clear_aging: set the aging or clear it, not both"),
    # what a todo names must be there: a queue its endpoint has a grant for, declared limits
    (r"queue", r"queue "),
    (r"pool", r"pool "),
    (r"tags", r"tags: tag "),
    (r"rate_limit", r"rate limit "),
]
# A JSON value of any shape (a todo's payload, a result, an error): no NUL in its strings at any
# depth, nor deeper or larger than the README's limits, which a schema of "any value" cannot say.
JSON_VALUES = ("payload", "result", "error")


def unstated(field: str, error: str) -> bool:
    """Whether a refusal is for a rule in ``UNSTATED`` (or NUL inside a JSON value)."""
    if field.split(".")[0] in JSON_VALUES and "NUL character" in error:
        return True
    return any(re.fullmatch(f, field) and re.match(e, error) for f, e in UNSTATED)


@pytest.mark.parametrize(
    ("field", "error", "listed"),
    [
        # s44's findings (the schemathesis CLI, every check): rules no schema states, listed
        ("owner", "no user named ''", True),
        ("clear_aging", "aging_seconds and clear_aging: set the aging or clear it, not both", True),
        ("limit", "limit is required", True),
        ("base_limit", "base_limit is not a field of a pool limit", True),
        ("floor", "floor must not exceed base_limit (9 > 3)", True),
        ("windows[1].period", "windows[1] repeats an earlier window (same period, …)", True),
        ("policy.windows", "give the window limits either as windows or as max_claims_per_", True),
        ("result.a\u0000", "result.a\u0000: must not contain a NUL character (\u0000)", True),
        # rules the document states: a refusal for one is the document's fault
        ("scope", "scope must be endpoint:<slug-or-id>", False),
        ("If-Match", 'If-Match must be * or a list of quoted entity tags such as "0"', False),
        ("name", "name is required (at most 200 characters)", False),
        ("queues", "queues must be 1-64 letters, digits, '.', '_', ':' or '-'", False),
        ("limit", "limit: must not contain a NUL character (\u0000)", False),
        ("windows[0].weekday", "a week window needs windows[0].weekday, one of Mon, Tue", False),
        ("policy.window.weekday", "window.weekday applies only to a week window", False),
    ],
)
def test_only_the_rules_no_schema_states_are_listed(field: str, error: str, listed: bool) -> None:
    assert unstated(field, error) is listed


def _stated(ctx: Any, response: Any, case: Any) -> bool | None:
    """A schema-valid request is not refused as invalid, unless for a rule in ``UNSTATED``
    (schemathesis's positive_data_acceptance, with the 400s the document cannot prevent)."""
    if response.status_code != 400:
        return None
    body = response.json()
    if unstated(str(body.get("field")), str(body.get("error", ""))):
        return None
    raise AssertionError(
        f"a schema-valid request was refused: {body} (path {case.path_parameters}, query "
        f"{case.query}, headers {_sent_headers(case)}, body {case.body!r})"
    )


def _sent_headers(case: Any) -> dict[str, str]:
    return {k: v for k, v in (case.headers or {}).items() if k.lower() != "authorization"}


def _fuzz_one(operation: Any, base_url: str, token: str, mode: Any, calls: list[int]) -> None:
    checks = [*CHECKS, negative_data_rejection] if mode.is_negative else [*CHECKS, _stated]

    @settings(
        max_examples=EXAMPLES[mode],
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=mode))
    def run(case: Any) -> None:
        response = case.call_and_validate(
            base_url=base_url, headers={"Authorization": f"Bearer {token}"}, checks=checks
        )
        calls.append(response.status_code)

    run()


def _fuzz(
    schema: Any, base_url: str, token: str, mode: schemathesis.GenerationMode, calls: list[int]
) -> list[str]:
    failures: list[str] = []
    for result in schema.get_all_operations():
        assert isinstance(result, Ok), result
        operation = result.ok()
        if _streams(operation):  # never ends: test_the_event_stream_is_as_the_document_says
            continue
        try:
            _fuzz_one(operation, base_url, token, mode, calls)
        except Exception as exc:  # collected, so one report names every failing operation
            failures.append(f"{operation.label} ({mode.value}): {exc}")
    return failures


@pytest.mark.parametrize("who", ["agent", "operator"])
def test_the_openapi_document_is_true(tx_personas: Personas, live_url: str, who: str) -> None:
    todos = push(tx_personas, 3)
    services.claim(actor=tx_personas.as_agent(), todo_id=todos[0].id)
    token = tx_personas.agent_token if who == "agent" else human_token(tx_personas.owner)
    schema = schemathesis.openapi.from_url(f"{live_url}/api/v1/openapi.json")
    failures: list[str] = []
    calls: list[int] = []
    for mode in (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE):
        failures += _fuzz(schema, live_url, token, mode, calls)
    assert not failures, "\n\n".join(failures)
    operations = len(list(schema.get_all_operations()))
    assert len(calls) >= 5 * operations, "schemathesis made too few requests to mean anything"
    # The identity got through somewhere (not every answer was 401).
    assert any(200 <= status < 300 for status in calls)


def _streams(operation: Any) -> bool:
    """Whether the operation's answer is an event stream (one that stays open)."""
    ok = operation.definition.raw.get("responses", {}).get("200", {})
    return EVENT_STREAM in ok.get("content", {})


def test_the_event_stream_is_as_the_document_says(tx_personas: Personas, live_url: str) -> None:
    """The agents' event stream, a Django view rather than a ninja route, is in the document
    (it was not), and its head, its refusals and its opening answer as the document says.
    Schemathesis leaves it out: a stream that stays open is no request/response pair."""
    document = httpx.get(f"{live_url}/api/v1/openapi.json").json()
    operation = document["paths"][EVENTS_PATH]["get"]
    assert operation["operationId"] == "agent_events"
    assert operation["security"] == [{"VerbAuth": []}]
    declared = {int(code) for code in operation["responses"]}
    assert {200, 400, 401, 429, 503} <= declared
    bearer = {"Authorization": f"Bearer {tx_personas.agent_token}"}
    head = httpx.head(f"{live_url}{EVENTS_PATH}", headers=bearer)
    assert head.status_code == 200
    assert head.headers["content-type"].startswith(EVENT_STREAM)
    for headers, params, status in [
        ({}, {}, 401),
        ({"Authorization": "Bearer sbk_nope"}, {}, 401),
        (bearer, {"since": "1"}, 400),
    ]:
        refused = httpx.get(f"{live_url}{EVENTS_PATH}", headers=headers, params=params)
        assert refused.status_code == status and status in declared
        assert set(refused.json()) >= {"error", "code"}
    with httpx.stream("GET", f"{live_url}{EVENTS_PATH}", headers=bearer, timeout=10) as opened:
        assert opened.status_code == 200
        assert opened.headers["content-type"].startswith(EVENT_STREAM)
        first = next(opened.iter_text())
        assert first.startswith("retry: ")


def test_the_document_gives_the_pattern_of_each_checked_path_parameter(client: Any) -> None:
    """A queue or a limit name in a path is checked against a pattern (400 naming the field);
    the document allowed any string, so schemathesis's "valid" names were refused (s43)."""
    document = client.get("/api/v1/openapi.json").json()
    found: dict[str, list[str]] = {"queue": [], "name": []}
    for operations in document["paths"].values():
        for operation in operations.values():
            for parameter in operation.get("parameters", []):
                if parameter["in"] == "path" and parameter["name"] in found:
                    found[parameter["name"]].append(parameter["schema"].get("pattern", ""))
    assert len(found["queue"]) >= 6 and set(found["queue"]) == {QUEUE_NAME_RE}
    assert len(found["name"]) >= 3 and set(found["name"]) == {LIMIT_NAME_RE}
    # The patterns as the services apply them: what one refuses, the other does.
    for name, ok in [("gpu", True), ("vendor.a", True), ("GPU", False), ("-x", False)]:
        assert bool(re.fullmatch(LIMIT_NAME_RE, name)) is ok
        if not ok:
            with pytest.raises(InvalidArgument):
                check_limit_name(name, field_name="name")
    for queue, ok in [("inbox", True), ("Batch:2", True), ("bad name", False), (".x", False)]:
        assert bool(re.fullmatch(QUEUE_NAME_RE, queue)) is ok
        if not ok:
            with pytest.raises(InvalidArgument):
                check_queue_name(queue)


def _takes(check: Any, value: str) -> bool:
    try:
        check(value)
    except InvalidArgument:
        return False
    return True


# Header text, made of the pieces an entity-tag list is made of (and a few it may not hold), so
# that well-formed lists come up as often as malformed ones.
_PIECES = [" ", "\t", ",", '"', '"a"', '"0!#~"', 'W/"b"', "W/", "*", '"*"', '"\x80\xff"']
_HEADER_TEXT = st.lists(
    st.sampled_from([*_PIECES, "\x7f", '"\x7f"', '"\u0100"', "a", '"a b"']), max_size=8
).map("".join)


@settings(max_examples=600, deadline=None, derandomize=True, database=None)
@given(value=_HEADER_TEXT)
def test_the_documents_precondition_patterns_take_what_the_server_takes(value: str) -> None:
    """The If-Match and If-None-Match patterns the document gives match exactly the headers
    ``write_preconditions`` takes; a header schemathesis made from the pattern is never refused
    as malformed, and one the pattern refuses is."""
    assert bool(re.search(IF_MATCH_RE, value)) is _takes(
        lambda v: write_preconditions(v, None), value
    ), value
    assert bool(re.search(IF_NONE_MATCH_RE, value)) is _takes(
        lambda v: write_preconditions(None, v), value
    ), value


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(value=st.text(alphabet=" \t\n\u3000\x1f\x85\ufeff\x00aé:", max_size=8))
def test_the_documents_text_patterns_take_what_the_services_take(value: str) -> None:
    """Not blank (a name, a title, a reason, kept stripped), no NUL anywhere, and a budget's
    ``endpoint:<slug-or-id>`` scope: each pattern as the services check it."""
    assert bool(re.search(NOT_BLANK_RE, value)) is bool(value.strip() and "\x00" not in value)
    assert bool(re.search(NO_NUL_RE, value)) is ("\x00" not in value)
    for scoped in (value, f"endpoint:{value}", f"endpoints:{value}"):
        assert bool(re.search(SCOPE_RE, scoped)) is _takes(parse_scope, scoped), scoped


def test_the_space_class_is_what_strip_takes_off() -> None:
    """The document's patterns spell whitespace as SPACE_CLASS: exactly the characters
    ``str.strip()`` takes off, over every code point."""
    space = re.compile(f"[{SPACE_CLASS}]")
    differ = [
        hex(c)
        for c in range(sys.maxunicode + 1)
        if bool(space.fullmatch(chr(c))) is not chr(c).isspace()
    ]
    assert not differ, differ


def _patterns(node: Any) -> set[str]:
    if isinstance(node, dict):
        found = {node["pattern"]} if isinstance(node.get("pattern"), str) else set()
        return found.union(*(_patterns(v) for k, v in node.items() if k != "pattern"))
    if isinstance(node, list):
        return set().union(*(_patterns(v) for v in node))
    return set()


def _every_pattern(client: Any) -> set[str]:
    """Every pattern the REST document and the MCP tools' schemas give."""
    found = _patterns(client.get("/api/v1/openapi.json").json())
    for spec in verbs.load_verbs().values():
        found |= _patterns(spec.input_schema()) | _patterns(spec.output_schema())
    return found


# Where ECMA-262 (a JSON Schema pattern's dialect) and Python's re part: whitespace (U+001C-U+001F
# and U+0085 are Python's, U+FEFF is ECMA's), digits and word characters beyond ASCII (Python's).
_PARTING = ["\x1c", "\x1f", "\x85", "\ufeff", "\xa0", "\u3000", "\u0663", "é", "\u200b"]
_PROBES = [
    "",
    *_PARTING,
    *(f"a{c}" for c in _PARTING),
    *(f"{c}a{c}" for c in _PARTING),
    *(f"{c}https://example.com/x{c}" for c in _PARTING),
    *(f"endpoint:{c}" for c in _PARTING),
    "a",
    " a ",
    "0",
    "12:30",
]


def test_every_pattern_of_the_documents_means_in_javascript_what_it_means_here(client: Any) -> None:
    """A client reads the document's patterns as ECMA-262 expressions (JSON Schema's dialect;
    the TypeScript SDK's validator among them), the server's checks as Python's re (the tests
    above). ``\\s`` parted them: "\\x1f" was a valid claimant by the document and refused as
    blank. Each pattern is run in Node, with and without the ``u`` flag, on text where the two
    dialects part, and must match what re matches; none uses a class escape they read apart."""
    patterns = sorted(_every_pattern(client))
    assert NOT_BLANK_RE in patterns and len(patterns) >= 10, patterns
    apart = [p for p in patterns if re.search(r"(?<!\\)(?:\\\\)*\\[sSdDwWbB]", p)]
    assert not apart, apart
    script = (
        "const [patterns, probes] = JSON.parse(require('fs').readFileSync(0, 'utf8'));"
        "console.log(JSON.stringify(patterns.map((p) => ['', 'u'].map((flags) =>"
        " probes.map((x) => new RegExp(p, flags).test(x))))));"
    )
    ran = subprocess.run(
        [NODE, "-e", script],
        input=json.dumps([patterns, _PROBES]),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    differ = [
        (pattern, flags, probe)
        for pattern, by_flags in zip(patterns, json.loads(ran.stdout), strict=True)
        for flags, matched in zip(["", "u"], by_flags, strict=True)
        for probe, js in zip(_PROBES, matched, strict=True)
        if js is not bool(re.search(pattern, probe))
    ]
    assert not differ, differ


def test_the_document_names_the_zones_a_window_takes(client: Any) -> None:
    """A window's tz is one of the zones the check takes (schemathesis's made-up names were
    refused), every one of them, and the same list in each window schema."""
    schemas = client.get("/api/v1/openapi.json").json()["components"]["schemas"]
    named = [schemas[n]["properties"]["tz"]["enum"] for n in ("WindowIn", "WindowLimitIn")]
    assert named[0] == named[1] == zones() and len(named[0]) > 400
    assert all(zone_exists(z) for z in named[0])
    assert "Europe/Berlin" in named[0] and "UTC" in named[0] and "europe/berlin" not in named[0]


@pytest.mark.parametrize(
    "window",
    [
        {"period": "week", "tz": "UTC", "weekday": "Mon"},
        {"period": "week", "tz": "UTC"},
        {"period": "week", "tz": "UTC", "weekday": None},
        {"period": "day", "tz": "UTC"},
        {"period": "day", "tz": "UTC", "weekday": None},
        {"period": "day", "tz": "UTC", "weekday": "Mon"},
        {"period": "hour", "tz": "UTC", "weekday": "Sun"},
    ],
)
def test_the_document_says_when_a_window_takes_a_weekday(client: Any, window: Any) -> None:
    """Required for a week window and refused for any other (s44 found the document silent):
    each window schema's verdict is the service's."""
    schemas = client.get("/api/v1/openapi.json").json()["components"]["schemas"]
    takes = _takes(lambda w: _clean_window(w, 1), window)
    for name, shape in (("WindowIn", window), ("WindowLimitIn", {**window, "limit": 1})):
        valid = Draft202012Validator(schemas[name]).is_valid(shape)
        assert valid is takes, (name, shape)


def _app_models() -> dict[str, list[type[BaseModel]]]:
    """Every pydantic model the apps define, by class name."""
    seen: dict[str, list[type[BaseModel]]] = {}
    stack: list[type[BaseModel]] = [BaseModel]
    while stack:
        cls = stack.pop()
        for sub in cls.__subclasses__():
            stack.append(sub)
            if sub.__module__.split(".")[0] in ("queues", "admission", "switchboard"):
                seen.setdefault(sub.__name__, []).append(sub)
    return seen


def _shape(model: type[BaseModel]) -> Any:
    schema = model.model_json_schema()
    schema.pop("description", None)
    if schema.get("additionalProperties") is True:  # JSON Schema's default anyway
        del schema["additionalProperties"]
    return schema


def test_schemas_sharing_a_name_share_a_shape(client: Any) -> None:
    """The OpenAPI document keys schemas by class name: two different shapes under one name
    would make it lie about one of them."""
    client.get("/api/v1/openapi.json")  # every router is imported
    for name, models in _app_models().items():
        shapes = {json.dumps(_shape(m), sort_keys=True) for m in models}
        assert len(shapes) == 1, f"{name} is defined differently in " + ", ".join(
            sorted(m.__module__ for m in models)
        )
