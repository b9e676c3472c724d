"""A form sent to the API or to MCP, over the server agents reach (uvicorn and its lean agent
paths, not the test client): refused naming the body, whatever its bytes, and a multipart body
Django cannot parse is the same refusal, not a complaint about the Host with a traceback."""

from __future__ import annotations

import json
import logging
from typing import Any

import httpx
import pytest

from queues.models import Todo
from tests.api.conftest import human_token
from tests.conftest import Personas

FORM_TYPES = [
    "application/x-www-form-urlencoded",
    "multipart/form-data; boundary=xyz",
    "multipart/form-data",  # no boundary: Django cannot even split it
    "multipart/form-data; boundary=",
]


def _refusal(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 400, response.text
    body: dict[str, Any] = response.json()
    return body


@pytest.mark.parametrize("content_type", FORM_TYPES)
def test_a_form_is_refused_on_the_body_even_when_its_bytes_are_json(
    tx_personas: Personas, live_url: str, content_type: str, caplog: pytest.LogCaptureFixture
) -> None:
    p = tx_personas
    agent = {"Authorization": f"Bearer {p.agent_token}", "Content-Type": content_type}
    operator = {
        "Authorization": f"Bearer {human_token(p.owner)}",
        "Content-Type": content_type,
    }
    create = json.dumps({"queue": "inbox", "title": "sent as a form"})
    with caplog.at_level(logging.WARNING, logger="django.request"):
        answers = [
            httpx.post(f"{live_url}/api/v1/agent/list_todos", content=b"{}", headers=agent),
            httpx.post(f"{live_url}/api/v1/agent/create_todo", content=create, headers=agent),
            httpx.post(f"{live_url}/api/v1/todos", content=create, headers=operator),
        ]
        for answer in answers:
            refusal = _refusal(answer)
            assert refusal["field"] == "body", refusal
            assert refusal["code"] == "invalid_argument"
        ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
        mcp = httpx.post(
            f"{live_url}/mcp/{p.agent.slug}",
            content=json.dumps(ping),
            headers=agent | {"Accept": "application/json, text/event-stream"},
        )
    # MCP takes only JSON: every form is 415 naming the Content-Type, a broken one too.
    assert mcp.status_code == 415, mcp.text
    assert mcp.json()["error"]["data"]["field"] == "Content-Type", mcp.text
    assert not Todo.objects.filter(title="sent as a form").exists()
    # Django logged "Bad request (Unable to parse request body)" with the parser's traceback.
    assert not [r for r in caplog.records if r.exc_info], caplog.text
