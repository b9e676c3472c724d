"""The commands' edges: what an argument may hold, who ``--as`` may name, and help and flags
that say what the command does. Usage errors exit 2 naming the option; refusals exit 1."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command, load_command_class

from admission.limits.models import RateLimit
from admission.models import AdmissionPolicy
from queues.models import Endpoint, EndpointState, HumanToken, QueuePause, Todo
from switchboard.embedded import free_port
from tests.cli.test_cli import BASE_DIR, manage
from tests.conftest import Personas

BAD = "x\udcff"  # what Python makes of the byte 0xff in argv: a lone surrogate


def usage_error(*args: str) -> str:
    """The message of a usage error (exit 2) from ``args``."""
    with pytest.raises(CommandError) as caught:
        call_command(*args, stdout=io.StringIO(), stderr=io.StringIO())
    assert caught.value.returncode == 2, caught.value
    return str(caught.value)


def refusal(*args: str) -> dict[str, Any]:
    """The error object of a refusal (exit 1) from ``args`` run with --json."""
    err = io.StringIO()
    with pytest.raises(CommandError) as caught:
        call_command(*args, "--json", stdout=io.StringIO(), stderr=err)
    assert caught.value.returncode == 1, caught.value
    body: dict[str, Any] = json.loads(err.getvalue())
    return body


def ok(*args: str) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


# --- 1. numbers in digits 0-9 ------------------------------------------------------------------


def test_a_window_limit_is_counted_in_digits_0_9_only(personas: Personas) -> None:
    slug = personas.agent.slug
    for window in ("²/hour", "١٠/hour", "-5/hour"):
        message = usage_error("queue", "budget", "set", slug, "inbox", f"--window={window}")
        assert "--window" in message and "digits 0-9" in message, window
    assert not AdmissionPolicy.objects.exists()


def test_a_token_id_in_other_digits_is_not_found_not_a_traceback(personas: Personas) -> None:
    for given in ("²", "١٠"):
        error = refusal("token", "revoke", given)
        assert (error["code"], error["field"]) == ("not_found", "token")


def test_integer_options_take_digits_0_9_only_from_a_real_shell(tx_personas: Personas) -> None:
    slug = tx_personas.agent.slug
    arabic = manage("queue", "budget", "set", slug, "inbox", "--per-day", "١٠", "--as", "olive")
    assert arabic.returncode == 2 and "--per-day" in arabic.stderr
    assert "Traceback" not in arabic.stderr
    rps = manage(
        "endpoint", "vend", "--owner", "olive", "--name", "n", "--queues", "a", "--rps", "nan"
    )
    assert rps.returncode == 2 and "--rps" in rps.stderr
    ttl = manage(
        "endpoint", "vend", "--owner", "olive", "--name", "n", "--queues", "a", "--lease-ttl", "٣٠"
    )
    assert ttl.returncode == 2 and "--lease-ttl" in ttl.stderr
    assert not AdmissionPolicy.objects.exists()
    assert not Endpoint.objects.filter(name="n").exists()


# --- 2. --as and --owner name someone who can act ----------------------------------------------


def test_an_empty_as_or_owner_is_a_usage_error(personas: Personas) -> None:
    slug = personas.agent.slug
    assert "--as" in usage_error("queue", "pause", "inbox", "--reason", "x", "--as", "")
    assert not QueuePause.objects.exists()
    assert "--as" in usage_error("endpoint", "revoke", slug, "--as", "")
    assert Endpoint.objects.get(slug=slug).state == EndpointState.ACTIVE
    assert "--as" in usage_error(
        "queue", "budget", "set", slug, "inbox", "--per-day", "5", "--as", ""
    )
    assert not AdmissionPolicy.objects.exists()
    assert "--owner" in usage_error("endpoint", "list", "--owner", "")


def test_a_deactivated_as_user_is_refused(personas: Personas) -> None:
    User.objects.filter(username="ada").update(is_active=False)
    User.objects.filter(username="olive").update(is_active=False)
    slug = personas.agent.slug
    for args in (
        ("queue", "pause", "inbox", "--reason", "x", "--as", "ada"),
        ("queue", "resume", "inbox", "--as", "ada"),
        ("queue", "budget", "set", slug, "inbox", "--per-day", "5", "--as", "olive"),
        ("queue", "budget", "show", "--as", "olive"),
        ("limits", "set", "pool", "gpu", "--slots", "2", "--as", "ada"),
        ("limits", "queue", "pause", "inbox", "--as", "ada"),
        ("endpoint", "revoke", slug, "--as", "olive"),
        ("token", "create", "--user", "otto", "--as", "ada"),
    ):
        error = refusal(*args)
        assert error["field"] == "as" and "--as" in error["error"], args
        assert "is deactivated" in error["error"], args
    assert not QueuePause.objects.exists() and not AdmissionPolicy.objects.exists()
    assert Endpoint.objects.get(slug=slug).state == EndpointState.ACTIVE
    assert not HumanToken.objects.exists()


# --- 3. invalid UTF-8 in any argument ----------------------------------------------------------

LOOKUPS = [
    (("endpoint", "revoke", BAD), "SLUG"),
    (("endpoint", "rotate-hook-secret", BAD), "SLUG"),
    (("endpoint", "revoke", "agent", "--as", BAD), "--as"),
    (("endpoint", "list", "--owner", BAD), "--owner"),
    (("endpoint", "vend", "--owner", "olive", "--name", "n", "--queues", BAD), "--queues"),
    (("token", "revoke", BAD), "PREFIX_OR_ID"),
    (("token", "create", "--user", BAD), "--user"),
    (("todo", "push", BAD, "inbox", "--title", "t"), "ENDPOINT"),
    (("todo", "push", "agent", "inbox", "--title", BAD), "--title"),
    (("queue", "budget", "show", BAD), "ENDPOINT"),
    (("queue", "budget", "set", "agent", "inbox", "--window", BAD), "--window"),
    (("queue", "pause", BAD, "--reason", "x"), "NAME"),
    (("queue", "resume", "inbox", "--as", BAD), "--as"),
    (("limits", "set", "pool", BAD, "--slots", "1"), "NAME"),
    (("limits", "queue", "pause", "inbox", "--reason", BAD), "--reason"),
]


@pytest.mark.parametrize(("args", "name"), LOOKUPS, ids=[" ".join(a[:2]) for a, _ in LOOKUPS])
def test_invalid_utf8_in_an_argument_is_a_usage_error_naming_it(
    personas: Personas, args: tuple[str, ...], name: str
) -> None:
    message = usage_error(*args)
    assert message.startswith(f"{name}: ") and "is not valid UTF-8" in message
    assert not Todo.objects.exists() and not QueuePause.objects.exists()
    assert not HumanToken.objects.exists() and not AdmissionPolicy.objects.exists()


def test_invalid_utf8_from_a_real_shell_is_a_usage_error(tx_personas: Personas) -> None:
    done = manage("endpoint", "revoke", b"cli6-\xff")
    assert done.returncode == 2 and "SLUG" in done.stderr and "Traceback" not in done.stderr


# --- 4. seed_demo --force ----------------------------------------------------------------------


def test_seed_demo_on_an_empty_database_prints_every_secret_once(db: None) -> None:
    first = ok("seed_demo")
    assert "First run: demo data created" in first and "Demo login: operator / " in first
    assert "Auditor login: auditor / " in first and "Endpoint deployer: token sbk_" in first
    assert "already seeded" in ok("seed_demo")


def test_seed_demo_force_adds_what_is_missing_and_keeps_what_exists(personas: Personas) -> None:
    # Users of its own (made before the first start), none of the demo's: nothing without
    # --force, and no claim that it was seeded.
    assert not User.objects.filter(username="operator").exists()
    said = ok("seed_demo")
    assert "Demo data: not seeded, since this database has users of its own" in said
    assert "already seeded" not in said
    first = ok("seed_demo", "--force")
    assert "Demo login: operator / " in first and "Endpoint triage: token sbk_" in first
    operator = User.objects.get(username="operator")
    assert operator.is_superuser and User.objects.get(username="auditor").groups.exists()
    todos = Todo.objects.count()
    assert todos and set(
        Endpoint.objects.filter(owner=operator).values_list("slug", flat=True)
    ) == {
        "triage",
        "deployer",
    }
    Endpoint.objects.filter(slug="deployer").delete()

    again = ok("seed_demo", "--force")  # the demo users exist now: kept, not recreated
    assert "Demo login" not in again and "operator (exists; password unchanged)" in again
    assert "Endpoint deployer: token sbk_" in again and "Endpoint triage" not in again
    assert User.objects.filter(username="operator").count() == 1
    assert "nothing to add" in ok("seed_demo", "--force")


# --- 5. an empty zone ---------------------------------------------------------------------------


def test_an_empty_zone_is_a_usage_error_not_utc(personas: Personas) -> None:
    slug = personas.agent.slug
    assert "--tz" in usage_error(
        "queue", "budget", "set", slug, "inbox", "--per-day", "5", "--tz", ""
    )
    for window in ("5/hour@", "5/day@UTC@", "5/week@UTC@00:00@"):
        assert "--window" in usage_error(
            "queue", "budget", "set", slug, "inbox", "--window", window
        )
    assert not AdmissionPolicy.objects.exists()


@pytest.mark.parametrize(
    ("window", "says"),
    [
        ("/day", "N, the claims per window, is empty"),
        (" /day@UTC", "N, the claims per window, is empty"),
        ("5/", "PERIOD is empty"),
        ("5/ ", "PERIOD is empty"),
        ("5/@UTC", "PERIOD is empty"),
        ("5/@", "PERIOD is empty"),
        ("5/hour@", "ZONE is empty: leave it out with its '@' for UTC"),
        ("5/hour@ ", "ZONE is empty: leave it out with its '@' for UTC"),
        ("5/day@@10:00", "ZONE is empty: name it (e.g. UTC) before HH:MM"),
        ("5/week@@@", "ZONE is empty: name it (e.g. UTC) before HH:MM"),
        ("5/day@UTC@", "HH:MM, the start time, is empty: leave it out with its '@' for 00:00"),
        ("5/week@UTC@@Mon", "HH:MM, the start time, is empty: write it before DAY"),
        ("5/week@UTC@00:00@", "DAY, the weekday a week starts on, is empty: write Mon"),
        ("5/day@UTC@00:00@", "DAY is empty: only a week window takes a weekday"),
        ("", "write N/PERIOD[@ZONE[@HH:MM[@DAY]]]"),
        ("5", "write N/PERIOD[@ZONE[@HH:MM[@DAY]]]"),
        ("5/week@UTC@00:00@Mon@", "write N/PERIOD[@ZONE[@HH:MM[@DAY]]]"),
    ],
)
def test_each_empty_part_of_a_window_is_a_usage_error_naming_that_part(
    personas: Personas, window: str, says: str
) -> None:
    """An empty PERIOD was a refusal (exit 1, ``windows[0].period``), and an empty start time
    was answered with advice about the zone."""
    message = usage_error(
        "queue", "budget", "set", personas.agent.slug, "inbox", "--window", window
    )
    assert message.startswith(f"--window {window!r}: ") and says in message, message
    assert not AdmissionPolicy.objects.exists()


def test_an_empty_start_or_weekday_flag_is_a_usage_error_as_in_a_window(
    personas: Personas,
) -> None:
    """They were refusals (exit 1, ``window.start``), unlike an empty --tz."""
    slug = personas.agent.slug
    for flag, period, says in (
        ("--start", "--per-day", "--start: write HH:MM (it is empty"),
        ("--weekday", "--per-week", "--weekday: name a day, Mon to Sun (it is empty)"),
    ):
        message = usage_error("queue", "budget", "set", slug, "inbox", period, "5", flag, "")
        assert message.startswith(says), message
    assert not AdmissionPolicy.objects.exists()


def test_an_empty_period_exits_2_on_the_command_line_before_anything_is_looked_up(
    db: None,
) -> None:
    # Neither the endpoint nor the --as user exists: the window is the first thing checked.
    done = manage("queue", "budget", "set", "nowhere", "inbox", "--window", "5/", "--as", "nobody")
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "--window '5/': PERIOD is empty" in done.stderr


# --- 6. resume of a name nothing has used -------------------------------------------------------


def test_resume_of_a_name_nothing_has_used_is_not_found_as_pause_says(personas: Personas) -> None:
    paused = refusal("queue", "pause", "nowhere", "--reason", "x")
    resumed = refusal("queue", "resume", "nowhere")
    assert paused["code"] == resumed["code"] == "not_found"
    assert resumed["field"] == "queue" and "nowhere" in resumed["error"]
    assert refusal("limits", "queue", "pause", "nowhere", "--resume")["code"] == "not_found"
    # A known queue that is not paused: nothing to lift, and it says so.
    assert "inbox was not paused" in ok("queue", "resume", "inbox")
    ok("limits", "queue", "create", "batch")  # declared here: known to limits' resume
    assert "batch was not paused" in ok("limits", "queue", "pause", "batch", "--resume")


# --- 7. help and flags that say what the command does --------------------------------------------


def test_endpoint_help_names_every_subcommand(personas: Personas) -> None:
    help_text = load_command_class("queues", "endpoint").help.lower()
    for word in ("vend", "list", "revoke", "rotate"):
        assert word in help_text


def test_limits_rate_set_takes_decay_step(personas: Personas) -> None:
    ok("limits", "rate", "set", "vendor", "--base-limit", "60", "--decay-step", "2")
    assert RateLimit.objects.get(name="vendor").decay_step == 2


def test_limits_queue_resume_refuses_pause_only_flags(personas: Personas) -> None:
    ok("limits", "queue", "pause", "inbox")
    for extra in (("--reason", "x"), ("--create",)):
        message = usage_error("limits", "queue", "pause", "inbox", "--resume", *extra)
        assert extra[0] in message
    assert QueuePause.objects.filter(queue="inbox").exists()


@pytest.mark.parametrize("sweep", ["reap_expired", "requeue_due_retries"])
def test_every_sweep_takes_json(personas: Personas, sweep: str) -> None:
    assert json.loads(ok(sweep, "--json")) == {"todos": 0}


# --- 8. not found names the argument and the value ---------------------------------------------


def test_budget_show_of_an_unknown_endpoint_names_it(personas: Personas) -> None:
    error = refusal("queue", "budget", "show", "nowhere")
    assert (error["code"], error["field"]) == ("not_found", "endpoint")
    assert "'nowhere'" in error["error"]


# --- a dependency that does not answer ---------------------------------------------------------


def test_a_database_that_does_not_answer_is_a_refusal_not_a_traceback() -> None:
    """A wrong DATABASE_URL (or the database down): 99 lines ending in the pool's
    OperationalError, and with --json no error object at all."""
    port = free_port()  # nothing listens there
    env = {
        **os.environ,
        "DATABASE_URL": f"postgresql://nobody:x@127.0.0.1:{port}/nothing",
        "REDIS_URL": settings.REDIS_URL,
    }
    args = ["queue", "pause", "inbox", "--reason", "x", "--as", "operator"]
    for extra in ([], ["--json"]):
        done = subprocess.run(
            [sys.executable, "manage.py", *args, *extra],
            cwd=BASE_DIR,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 1, done.stderr
        assert "Traceback" not in done.stderr, done.stderr
        if extra:
            error = json.loads(done.stderr)
            assert (error["code"], error["dependency"]) == ("unavailable", "database")
        else:  # after the pool's warnings, which name the cause
            last = done.stderr.strip().splitlines()[-1]
            assert last.startswith("refused (unavailable): the database did not answer"), last
