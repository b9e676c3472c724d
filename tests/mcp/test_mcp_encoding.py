"""A tool result's bytes (issue 11). The answer is encoded once, and that text goes into the
reply twice: as the text content, escaped as a JSON string, and as ``structuredContent``,
spliced in as it is. The reply must be the bytes the whole response gives when encoded as one
JSON value (as it was before the splice), and its text must be its structured content's
encoding, on every revision and for awkward answers."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client
from hypothesis import given
from hypothesis import strategies as st

from switchboard import mcp
from switchboard.core import verbs
from tests.api.test_plain_render import AWKWARD_TODO
from tests.conftest import Personas, push
from tests.mcp.test_mcp_http import Mcp

# What a payload may hold that an encoder could write in more than one way: non-ASCII (escaped
# as \\u…), a line separator, DEL, quotes and backslashes, floats in exponent form (pydantic
# writes 1e-05 as 0.00001 and 1.5e-07 as 1.5e-7), a big integer, negative zero, nesting, an
# empty object and list.
AWKWARD = {
    "text": 'café ☕ \u2028 \x7f "quoted" \\ back\nslash\t',
    "numbers": [1e16, 0.1, -0.0, 2**70, -3, 1.5e-7, 1e-05],
    "nested": {"a": [None, True, False, {"b": []}], "": {}},
}


def _whole(value: Any) -> bytes:
    """The value encoded as one JSON value, as the reply was before the splice."""
    return json.dumps(value, separators=(",", ":")).encode()


@pytest.mark.parametrize("answer", [{}, {"todo": None}, {"todo": {"payload": AWKWARD}}])
@pytest.mark.parametrize("structured, is_error", [(True, False), (False, False), (False, True)])
def test_a_tool_results_encoding_is_the_whole_results(
    answer: dict[str, Any], structured: bool, is_error: bool
) -> None:
    result = mcp.ToolResult(mcp._dumps(answer), is_error, structured)
    as_dict = result.as_dict()
    assert result.encoded().encode() == _whole(as_dict)
    more = {"resultType": "complete", "_meta": {"x": [1, "é"]}}
    spliced = result.encoded(',"resultType":"complete","_meta":{"x":[1,"\\u00e9"]}')
    assert spliced.encode() == _whole({**as_dict, **more})
    assert json.loads(spliced)["content"][0]["text"] == mcp._dumps(answer)


def _check_reply(content: bytes) -> dict[str, Any]:
    body = json.loads(content)
    assert content == _whole(body)  # the bytes of the response encoded whole
    result: dict[str, Any] = body["result"]
    text = result["content"][0]["text"]
    assert "\\u00e9" in text and "\\u2028" in text  # the text is ASCII, as json.dumps gives it
    if "structuredContent" in result:
        assert text == mcp._dumps(result["structuredContent"])
    return result


def test_a_modern_tool_calls_reply_is_its_result_encoded_whole(
    personas: Personas, client: Client
) -> None:
    agent = Mcp(client, personas.agent.slug, personas.agent_token)
    push(personas, payload=AWKWARD)
    response = agent.modern("tools/call", {"name": "claim_next", "arguments": {}})
    assert response.status_code == 200
    result = _check_reply(response.content)
    assert list(result) == ["content", "isError", "structuredContent", "resultType", "_meta"]
    assert result["structuredContent"]["todo"]["payload"] == AWKWARD
    assert result["_meta"] == {mcp.SERVER_INFO_KEY: mcp.SERVER_INFO}


@pytest.mark.parametrize("version", ["2025-11-25", "2025-03-26"])
def test_a_handshake_tool_calls_reply_is_its_result_encoded_whole(
    personas: Personas, client: Client, version: str
) -> None:
    agent = Mcp(client, personas.agent.slug, personas.agent_token)
    agent.initialize(version)
    push(personas, payload=AWKWARD)
    response = agent.rpc("tools/call", {"name": "claim_next", "arguments": {}})
    assert response.status_code == 200
    result = _check_reply(response.content)
    structured = version in mcp.STRUCTURED_VERSIONS
    assert list(result) == ["content", "isError", *(["structuredContent"] if structured else [])]


def test_a_refusals_reply_is_its_result_encoded_whole(personas: Personas, client: Client) -> None:
    agent = Mcp(client, personas.agent.slug, personas.agent_token)
    response = agent.modern(
        "tools/call", {"name": "complete", "arguments": {"id": "not-a-uuid", "x": AWKWARD}}
    )
    assert response.status_code == 200
    body = json.loads(response.content)
    assert response.content == _whole(body)
    result = body["result"]
    assert result["isError"] is True and "structuredContent" not in result
    assert list(result) == ["content", "isError", "resultType", "_meta"]


@pytest.mark.parametrize("ident", [0, 7, 2**70, -1, "m1", "é ☕ \u2028", ""])
def test_a_modern_replys_id_is_as_json_encodes_it(
    personas: Personas, client: Client, ident: int | str
) -> None:
    agent = Mcp(client, personas.agent.slug, personas.agent_token)
    meta = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
    }
    params = {"name": "claim_next", "arguments": {}, "_meta": meta}
    message = {"jsonrpc": "2.0", "id": ident, "method": "tools/call", "params": params}
    headers = {"MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/call"}
    response = agent.post(message, **headers, **{"Mcp-Name": "claim_next"})
    assert response.status_code == 200
    body = json.loads(response.content)
    assert response.content == _whole(body) and body["id"] == ident


@pytest.mark.parametrize(
    "value",
    [
        "\x7f",
        1e-05,
        9.99e-05,
        1.5e-07,
        2.5e-300,
        1e-4,
        1e16,
        "e-0.0000",
        "plain",
        0.1,
        2**70,
        -1.5e-07,
        -5e-05,
        [0.5, 1e-05],
        [1e-05],
        {"a": 1, "b": 2.5e-9},
        '":1e-5',
    ],
)
def test_a_tool_calls_text_is_the_answer_as_json_writes_it(value: Any) -> None:
    """The tool's text comes from the verb's JSON answer (``verbs.call_json``, pydantic's
    encoder), written as ``_dumps`` writes the checked answer, DEL and small floats included."""
    spec = verbs.get("complete")
    assert spec is not None
    answer = {"todo": {**AWKWARD_TODO, "result": {"v": value}}}
    text = mcp._as_dumped(spec.render_json(answer))
    assert text == mcp._dumps(spec.render(answer))


# JSON values as a verb's answer may hold them: finite floats of every size, integers, text with
# "e-" and "0.0000" in it, nested in lists and objects.
_JSONABLE = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.floats(min_value=-1e-4, max_value=1e-4)  # where the two encoders differ
    | st.text(alphabet=st.sampled_from('0123456789.e-:,[]"ab\x7f')),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=3), inner, max_size=4)
    ),
    max_leaves=12,
)


@given(_JSONABLE)
def test_an_answer_pydantic_writes_otherwise_than_json_is_always_written_again(value: Any) -> None:
    """``_as_dumped`` passes pydantic's bytes through only where json would write the same
    bytes: never wrongly, whatever numbers and text the answer holds."""
    spec = verbs.get("complete")
    assert spec is not None
    answer = {"todo": {**AWKWARD_TODO, "result": {"v": value}}}
    assert mcp._as_dumped(spec.render_json(answer)) == mcp._dumps(spec.render(answer))
