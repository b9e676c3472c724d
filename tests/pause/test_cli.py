"""``manage.py queue pause|resume``: output, --as, and the exit codes 0 ok / 1 refused / 2 usage.

The exit codes are checked on a real ``manage.py`` process against the test database, since
argparse usage errors only become exit status 2 on a real command line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command

from queues.models import QueuePause
from tests.conftest import Personas, database_url, push
from tests.pause.helpers import pause

BASE_DIR = Path(__file__).resolve().parents[2]


def run(*args: str) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    call_command("queue", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def manage(*args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "REDIS_URL": settings.REDIS_URL,
        "DJANGO_SETTINGS_MODULE": "switchboard.settings",
    }
    return subprocess.run(
        [sys.executable, "manage.py", "queue", *args],
        cwd=BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_pause_as_the_only_superuser_prints_json(personas: Personas) -> None:
    out, _ = run("pause", "inbox", "--reason", "upgrade", "--json")

    body: dict[str, Any] = json.loads(out)
    assert (body["queue"], body["paused"], body["changed"]) == ("inbox", True, True)
    assert body["pause"]["by"] == "ada"
    assert body["pause"]["reason"] == "upgrade"
    assert QueuePause.objects.get(queue="inbox").paused_by == personas.admin


def test_pause_as_a_named_pauser_in_words(personas: Personas) -> None:
    out, _ = run("pause", "inbox", "--reason", "upgrade", "--as", "paul")

    assert out.startswith("paused inbox: upgrade (by paul")
    again, _ = run("pause", "inbox", "--reason", "again", "--as", "paul")
    assert "already paused" in again and "nothing changed" in again


def test_pause_refuses_an_unknown_name_unless_create(personas: Personas) -> None:
    with pytest.raises(CommandError) as refused:
        run("pause", "inbx", "--reason", "typo", "--json")
    assert refused.value.returncode == 1

    out, _ = run("pause", "night-batch", "--reason", "later", "--create", "--json")
    assert json.loads(out)["changed"] is True


def test_refusals_are_reported_as_the_error_object_on_stderr(personas: Personas) -> None:
    err = StringIO()
    with pytest.raises(CommandError) as refused:
        call_command("queue", "pause", "quarantine", "--reason", "x", "--json", stderr=err)

    assert refused.value.returncode == 1
    assert json.loads(err.getvalue()) == {
        "error": "the quarantine queue is never delivered, so it cannot be paused",
        "code": "invalid_argument",
        "field": "queue",
    }


def test_a_user_without_the_permission_is_refused(personas: Personas) -> None:
    with pytest.raises(CommandError) as refused:
        run("pause", "inbox", "--reason", "mine", "--as", "audrey")
    assert refused.value.returncode == 1
    assert not QueuePause.objects.exists()


def test_resume_reports_what_it_lifted_and_whom_it_rang(personas: Personas) -> None:
    push(personas, 1, queue="inbox")
    pause(personas.pauser, "inbox", reason="upgrade")

    out, _ = run("resume", "inbox", "--json")
    again, _ = run("resume", "inbox")

    body = json.loads(out)
    assert body["resumed"] is True
    assert body["lifted"]["reason"] == "upgrade"
    assert body["woken"] == [personas.agent.slug]
    assert again == "inbox was not paused; nothing was lifted\n"


def test_without_as_and_not_exactly_one_superuser_it_is_a_usage_error(
    personas: Personas,
) -> None:
    User.objects.create_superuser("bea", password="pw-bea-12345")

    with pytest.raises(CommandError) as usage:
        run("pause", "inbox", "--reason", "upgrade")
    assert usage.value.returncode == 2
    assert "--as" in str(usage.value)

    with pytest.raises(CommandError) as unknown:
        run("resume", "inbox", "--as", "nobody")
    assert unknown.value.returncode == 2


def test_exit_codes_on_a_real_command_line(tx_personas: Personas) -> None:
    ok = manage("pause", "inbox", "--reason", "upgrade", "--json")
    refused = manage("pause", "quarantine", "--reason", "nope", "--json")
    missing_reason = manage("pause", "inbox", "--json")
    no_subcommand = manage()
    resumed = manage("resume", "inbox", "--json", "--as", "paul")

    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["changed"] is True
    assert refused.returncode == 1, refused.stderr
    # The error object first; Django then repeats the message as "CommandError: …".
    error, _ = json.JSONDecoder().raw_decode(refused.stderr)
    assert (error["code"], error["field"]) == ("invalid_argument", "queue")
    assert missing_reason.returncode == 2, missing_reason.stderr
    assert "--reason" in missing_reason.stderr
    assert no_subcommand.returncode == 2, no_subcommand.stderr
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["resumed"] is True
    assert not QueuePause.objects.exists()
