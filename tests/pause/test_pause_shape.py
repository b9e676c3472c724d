"""One pause shape: ``queues.selectors.PauseInfo`` from ``pauses_of``, and every surface (the API,
the board, the queue and todo pages, the CLI's --json, list_todos' paused_queues) shows that one
shape, so they cannot disagree."""

from __future__ import annotations

import io
import json
from datetime import datetime

from django.core.management import call_command
from django.test import Client

from queues import agent_verbs, pauses, selectors
from queues.schemas import ListTodosIn
from switchboard.core.times import iso
from tests.conftest import Personas


def test_every_surface_shows_the_pause_the_selector_reads(personas: Personas) -> None:
    p = personas
    pauses.queue_pause(actor=p.as_human(p.pauser), queue="inbox", reason="deploy freeze")
    info = selectors.pause_of("inbox")
    assert info is not None and (info.by, info.reason) == ("paul", "deploy freeze")
    assert selectors.pauses_of() == {"inbox": info}
    assert selectors.pause_of("outbox") is None
    # Every surface writes an instant alike: UTC, microseconds, a Z (switchboard.core.times).
    at = info.at

    client = Client()
    client.force_login(p.admin)
    listed = client.get("/api/v1/queues").json()["queues"]
    (api,) = [q["paused"] for q in listed if q["queue"] == "inbox"]
    assert (api["reason"], api["by"]) == ("deploy freeze", "paul")
    assert datetime.fromisoformat(api["at"]) == at and api["at"] == iso(at)

    board = client.get("/")
    inbox = [s for s in board.context["sections"] if s.queue == "inbox"]
    assert inbox and all(s.pause == info for s in inbox)
    assert all(s.pause is None for s in board.context["sections"] if s.queue == "outbox")
    queue_page = client.get("/queues/inbox")
    assert queue_page.context["pause"] == info
    text = queue_page.content.decode()
    assert "by paul" in text and "deploy freeze" in text
    assert "by paul" in client.get("/queues").content.decode()

    out = io.StringIO()
    call_command(
        "queue", "pause", "inbox", "--reason", "again", "--as", "ada", "--json", stdout=out
    )
    cli = json.loads(out.getvalue())
    assert cli["changed"] is False
    assert cli["pause"] == {"reason": "deploy freeze", "by": "paul", "at": iso(info.at)}

    listed_todos = agent_verbs.list_todos(p.as_agent(), ListTodosIn())
    assert listed_todos["paused_queues"] == sorted(selectors.pauses_of(p.agent.scope_queues))
    assert listed_todos["paused_queues"] == ["inbox"]
