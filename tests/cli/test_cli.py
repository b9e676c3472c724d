"""``manage.py endpoint``, ``todo`` and ``token``: --json output and the exit codes (0 ok,
1 refused with the field named on stderr, 2 usage)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command

from queues.models import BASIC_VERBS, Endpoint, EndpointState, HumanToken, Todo
from tests.conftest import Personas, database_url, push

BASE_DIR = Path(__file__).resolve().parent.parent.parent


def manage(*args: str | bytes) -> subprocess.CompletedProcess[str]:
    """``manage.py`` in a process of its own, on the tests' database and Valkey (an argument may
    be bytes that are not UTF-8, as a shell passes them; output that is not is escaped)."""
    env = {**os.environ, "DATABASE_URL": database_url(), "REDIS_URL": settings.REDIS_URL}
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        errors="backslashreplace",
        timeout=120,
    )


def run(*args: str) -> Any:
    out = io.StringIO()
    call_command(*args, "--json", stdout=out, stderr=io.StringIO())
    return json.loads(out.getvalue())


def refusal(*args: str) -> tuple[int, dict[str, Any]]:
    err = io.StringIO()
    with pytest.raises(CommandError) as caught:
        call_command(*args, "--json", stdout=io.StringIO(), stderr=err)
    return caught.value.returncode, json.loads(err.getvalue())


def test_the_exit_codes_from_a_real_shell(tx_personas: Personas) -> None:
    vended = manage(
        "endpoint", "vend", "--owner", "olive", "--name", "Shell agent", "--queues", "a,b",
        "--rps", "0", "--json",
    )  # fmt: skip
    assert vended.returncode == 0, vended.stderr
    data = json.loads(vended.stdout)
    assert data["token"].startswith("sbk_") and data["endpoint"]["slug"] == "shell-agent"
    assert data["mcp_url"].endswith("/mcp/shell-agent")

    refused = manage("endpoint", "revoke", "no-such-endpoint")
    assert refused.returncode == 1
    assert "slug" in refused.stderr and "not_found" in refused.stderr
    assert refused.stderr.count("no endpoint with slug") == 1  # said once, not again by Django
    # With --json the refusal is the error object, alone on stderr: a script parses it.
    as_json = manage("endpoint", "revoke", "no-such-endpoint", "--json")
    assert as_json.returncode == 1 and as_json.stdout == ""
    assert json.loads(as_json.stderr)["code"] == "not_found"

    misused = manage("endpoint", "vend", "--name", "x", "--queues", "a")
    assert misused.returncode == 2
    assert "--owner" in misused.stderr

    unknown_owner = manage("endpoint", "vend", "--owner", "nobody", "--name", "x", "--queues", "a")
    assert unknown_owner.returncode == 2

    text = manage("endpoint", "vend", "--owner", "olive", "--name", "Text", "--queues", "a")
    assert text.returncode == 0
    assert "sbk_" in text.stdout and "/mcp/text" in text.stdout and "mcpServers" in text.stdout


def test_endpoint_vend_grants_what_it_is_told(personas: Personas) -> None:
    data = run(
        "endpoint", "vend", "--owner", "olive", "--name", "Budgeted", "--queues", "inbox",
        "--verbs", "claim_next,complete,set_admission_policy", "--lease-ttl", "90", "--rps", "5",
    )  # fmt: skip
    endpoint = Endpoint.objects.get(slug=data["endpoint"]["slug"])
    assert endpoint.scope_verbs == ["claim_next", "complete", "set_admission_policy"]
    assert endpoint.default_lease_ttl_seconds == 90 and endpoint.rate_limit_rps == 5
    assert data["mcp_json"]["mcpServers"]["switchboard-budgeted"]["headers"] == {
        "Authorization": f"Bearer {data['token']}"
    }
    default = run("endpoint", "vend", "--owner", "olive", "--name", "Plain", "--queues", "x")
    assert default["endpoint"]["scope_verbs"] == list(BASIC_VERBS)


def test_endpoint_vend_refusals_name_the_field(personas: Personas) -> None:
    code, error = refusal(
        "endpoint", "vend", "--owner", "olive", "--name", "x", "--queues", "inbox",
        "--verbs", "launch_missiles",
    )  # fmt: skip
    assert code == 1 and error["field"] == "verbs" and error["code"] == "invalid_argument"
    code, error = refusal(
        "endpoint", "vend", "--owner", "olive", "--name", "x", "--queues", "bad name"
    )
    assert code == 1 and error["field"] == "queues"
    # What the API refuses in a list of names (a trailing newline, an empty name), refused
    # alike; only the spaces around the commas are the list's own.
    for queues in ["inbox\n", "inbox,,outbox", "inbox,", "\tinbox"]:
        code, error = refusal(
            "endpoint", "vend", "--owner", "olive", "--name", "x", "--queues", queues
        )
        assert code == 1 and error["field"] == "queues", queues
    code, error = refusal(
        "endpoint", "vend", "--owner", "olive", "--name", "x", "--queues", "inbox",
        "--verbs", "claim_next,,complete",
    )  # fmt: skip
    assert code == 1 and error["field"] == "verbs"
    assert not Endpoint.objects.filter(name="x").exists()
    # A slug too long was refused as if its letters were wrong.
    code, error = refusal(
        "endpoint", "vend", "--owner", "olive", "--name", "x", "--queues", "inbox", "--slug", "a" * 64
    )  # fmt: skip
    assert code == 1 and error["field"] == "slug" and "1-63" in error["error"]
    spaced = run("endpoint", "vend", "--owner", "olive", "--name", "y", "--queues", "inbox, outbox")
    assert spaced["endpoint"]["scope_queues"] == ["inbox", "outbox"]


def test_endpoint_list_and_revoke(personas: Personas) -> None:
    push(personas, 2)
    listed = run("endpoint", "list")["endpoints"]
    assert {e["slug"] for e in listed} == {"agent", personas.agent2.slug, "foreign"}
    assert all("token" not in e for e in listed)
    mine = run("endpoint", "list", "--owner", "otto")["endpoints"]
    assert [e["slug"] for e in mine] == ["foreign"]

    # Another owner's endpoint is not found, as on the API: forbidden would say it exists.
    for verb in ("revoke", "rotate-hook-secret"):
        code, error = refusal("endpoint", verb, "agent", "--as", "otto")
        assert (code, error["code"], error["field"]) == (1, "not_found", "slug"), verb
        code, unknown = refusal("endpoint", verb, "no-such-endpoint", "--as", "otto")
        assert unknown["error"].replace("no-such-endpoint", "agent") == error["error"]
    assert Endpoint.objects.get(slug="agent").state == EndpointState.ACTIVE
    revoked = run("endpoint", "revoke", "agent")
    assert revoked["dead_lettered"] == 2 and revoked["endpoint"]["state"] == "revoked"
    assert revoked["changed"] is True
    assert Endpoint.objects.get(slug="agent").state == EndpointState.REVOKED
    # Again: it said "revoked agent; 0 live todo(s) dead-lettered", as if it had revoked it.
    again = run("endpoint", "revoke", "agent")
    assert (again["changed"], again["dead_lettered"]) == (False, 0)
    out = io.StringIO()
    call_command("endpoint", "revoke", "agent", stdout=out)
    assert out.getvalue().startswith("agent was already revoked (at ")
    assert "nothing changed" in out.getvalue()
    assert [e["slug"] for e in run("endpoint", "list", "--state", "revoked")["endpoints"]] == [
        "agent"
    ]


def test_todo_push_creates_once_per_key(personas: Personas) -> None:
    first = run(
        "todo", "push", "agent", "inbox", "--title", "From the shell",
        "--payload", '{"n": 1}', "--key", "shell-1",
    )  # fmt: skip
    assert first["created"] is True and first["todo"]["payload"] == {"n": 1}
    again = run("todo", "push", "agent", "inbox", "--title", "again", "--key", "shell-1")
    assert again["created"] is False and again["todo"]["id"] == first["todo"]["id"]
    assert again["differs"] == ["title", "payload"]  # as the API says: other work, not created
    retried = run(
        "todo", "push", "agent", "inbox", "--title", "From the shell",
        "--payload", '{"n": 1}', "--key", "shell-1",
    )  # fmt: skip
    assert retried["created"] is False and retried["differs"] == []
    out = io.StringIO()
    call_command("todo", "push", "agent", "inbox", "--title", "x", "--key", "shell-1", stdout=out)
    assert out.getvalue().startswith("not created: the key belongs to a live todo that differs")
    assert Todo.objects.get().source == "cli"


def test_todo_push_refusals_name_the_field(personas: Personas) -> None:
    code, error = refusal("todo", "push", "agent", "inbox", "--title", "x", "--payload", "{nope")
    assert code == 1 and error["field"] == "payload"
    code, error = refusal("todo", "push", "nowhere", "inbox", "--title", "x")
    assert code == 1 and error["field"] == "endpoint" and error["code"] == "not_found"
    code, error = refusal("todo", "push", "agent", "in box", "--title", "x")
    assert code == 1 and error["field"] == "queue"
    assert not Todo.objects.exists()


def test_a_human_token_from_the_shell_works_until_revoked(personas: Personas) -> None:
    from django.test import Client

    made = run("token", "create", "--user", "olive", "--name", "laptop")
    token = made["token"]
    assert token.startswith("sbh_") and made["user"] == "olive"
    api = Client()
    auth = {"Authorization": f"Bearer {token}"}
    assert api.get("/api/v1/endpoints", headers=auth).status_code == 200

    revoked = run("token", "revoke", made["prefix"])
    assert revoked["changed"] is True and revoked["revoked_at"]
    assert api.get("/api/v1/endpoints", headers=auth).status_code == 401
    assert run("token", "revoke", str(made["id"]))["changed"] is False


def test_token_revoke_refuses_what_it_cannot_find(personas: Personas) -> None:
    code, error = refusal("token", "revoke", "sbh_nothing")
    assert code == 1 and error["field"] == "token"
    run("token", "create", "--user", "olive")
    run("token", "create", "--user", "olive")
    code, error = refusal("token", "revoke", "sbh_")
    assert code == 1 and error["code"] == "conflict"
    assert HumanToken.objects.filter(revoked_at__isnull=True).count() == 2
    # Another person's token, named by its prefix, is not found (forbidden said it exists).
    olives = HumanToken.objects.first()
    assert olives is not None
    code, error = refusal("token", "revoke", olives.token_prefix, "--as", "otto")
    assert (code, error["code"], error["field"]) == (1, "not_found", "token")
    assert HumanToken.objects.filter(revoked_at__isnull=True).count() == 2


def test_a_missing_subcommand_is_a_usage_error(personas: Personas) -> None:
    for command in ("endpoint", "todo", "token"):
        with pytest.raises(CommandError) as caught:
            call_command(command, stdout=io.StringIO(), stderr=io.StringIO())
        assert caught.value.returncode == 2


def test_someone_elses_control_characters_never_reach_the_terminal_raw(
    personas: Personas,
) -> None:
    # A pause reason (another operator's) or a title may carry ESC sequences; written raw they
    # would recolour, retitle or rewrite the operator's terminal. Shown as \xNN instead; --json
    # escapes them as JSON does.
    reason = "upgrade \x1b]0;pwned\x07\x1b[2J\r\x9b31m"
    call_command("queue", "pause", "inbox", "--reason", reason, stdout=io.StringIO())
    out = io.StringIO()
    call_command("queue", "resume", "inbox", stdout=out)
    shown = out.getvalue()
    assert "upgrade \\x1b]0;pwned\\x07\\x1b[2J\\x0d\\x9b31m" in shown
    assert not any(c in shown for c in "\x1b\x07\r\x9b")
    out = io.StringIO()
    call_command("todo", "push", personas.agent.slug, "inbox", "--title", "t\x1b[31m", stdout=out)
    assert "t\\x1b[31m" in out.getvalue() and "\x1b" not in out.getvalue()
    assert (
        run("todo", "push", personas.agent.slug, "inbox", "--title", "t\x1b[31m")["todo"]["title"]
        == "t\x1b[31m"
    )
