"""``manage.py queue budget show|set|clear``: output, --json and the exit codes 0 / 1 / 2."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from io import StringIO
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError

from admission.models import AdmissionPolicy
from tests.admission.conftest import budget
from tests.conftest import Personas, audit_rows, database_url, push

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str) -> tuple[int, str, str]:
    out, err = StringIO(), StringIO()
    try:
        call_command("queue", "budget", *args, stdout=out, stderr=err)
    except CommandError as exc:
        return exc.returncode, out.getvalue(), err.getvalue()
    return 0, out.getvalue(), err.getvalue()


def test_set_creates_a_budget_and_prints_it(personas: Personas) -> None:
    p = personas
    code, out, _ = run(
        "set",
        p.agent.slug,
        "inbox",
        "--per-day",
        "50",
        "--tz",
        "America/Los_Angeles",
        "--start",
        "07:00",
        "--max-in-flight",
        "2",
        "--as",
        "olive",
    )
    assert code == 0
    assert out.startswith(f"set endpoint:{p.agent.slug}/inbox  [enforce]  0/50 per day from 07:00")
    assert "in flight 0/2  admitted" in out
    policy = AdmissionPolicy.objects.get()
    assert (policy.window_period, policy.window_tz, policy.window_start) == (
        "day",
        "America/Los_Angeles",
        "07:00",
    )
    assert audit_rows().get().actor_human_name == "olive"


def test_set_is_a_full_replace_with_json_output(personas: Personas) -> None:
    p = personas
    budget(p, per="day", limit=5, max_in_flight=3)
    code, out, _ = run(
        "set",
        p.agent.slug,
        "inbox",
        "--per-week",
        "100",
        "--weekday",
        "Mon",
        "--posture",
        "advise",
        "--json",
        "--as",
        "olive",
    )
    assert code == 0
    body = json.loads(out)
    assert body["policy"]["max_in_flight"] is None
    assert body["policy"]["window"]["period"] == "week" and body["policy"]["window"]["tz"] == "UTC"
    assert body["policy"]["posture"] == "advise"


def test_show_lists_budgets_and_one_of_them(personas: Personas) -> None:
    p = personas
    budget(p, per="day", limit=1)
    budget(p, "outbox", max_in_flight=4)
    push(p, 2)
    from queues import services

    services.claim_next(actor=p.as_agent(), queue="inbox")
    code, out, _ = run("show", "--as", "olive")
    assert code == 0
    lines = out.strip().splitlines()
    assert len(lines) == 2
    assert "1/1 per day from 00:00 UTC" in lines[0]
    assert "deferred: window_exhausted until" in lines[0]
    assert "in flight 0/4  admitted" in lines[1]
    code, out, _ = run("show", p.agent.slug, "outbox", "--json", "--as", "olive")
    assert code == 0
    (row,) = json.loads(out)["policies"]
    assert row["policy"]["queue"] == "outbox" and row["status"]["state"] == "admitted"


def test_show_of_a_foreign_or_missing_budget_is_refused(personas: Personas) -> None:
    p = personas
    code, _, err = run("show", p.foreign.slug, "--as", "olive")
    assert code == 1 and "not_found" in err
    code, _, err = run("show", p.agent.slug, "inbox", "--json", "--as", "olive")
    assert code == 1 and json.loads(err)["code"] == "not_found"
    # An empty endpoint names none (it was an AssertionError with a queue after it).
    for args in (["", "inbox"], [""]):
        code, _, err = run("show", *args, "--json", "--as", "olive")
        assert code == 1 and json.loads(err)["code"] == "not_found", args


def test_ledger_verify_bounds_its_batch(personas: Personas) -> None:
    # The hidden --batch is a LIMIT: 30 digits was a bigint error from PostgreSQL.
    for batch in ("0", "9" * 30):
        err = StringIO()
        with pytest.raises(CommandError) as refused:
            call_command("ledger", "verify", "--batch", batch, stdout=StringIO(), stderr=err)
        assert "must be between 1 and 100000" in str(refused.value), batch
    out = StringIO()
    call_command("ledger", "verify", "--batch", "100000", "--json", stdout=out)
    assert json.loads(out.getvalue())["ok"] is True


def test_a_bad_budget_is_refused_with_exit_one_naming_the_field(personas: Personas) -> None:
    p = personas
    stored = budget(p, max_in_flight=1)
    code, _, err = run(
        "set", p.agent.slug, "inbox", "--per-day", "5", "--tz", "Moon/Base", "--as", "olive"
    )
    assert code == 1 and "window.tz" in err
    code, _, err = run("set", p.agent.slug, "inbox", "--per-week", "5", "--json", "--as", "olive")
    assert code == 1 and json.loads(err)["field"] == "window.weekday"
    code, _, err = run("set", p.agent.slug, "inbox", "--max-in-flight", "-3", "--as", "olive")
    assert code == 1 and "max_in_flight" in err
    assert AdmissionPolicy.objects.get().max_in_flight == stored.max_in_flight


def test_clear_removes_a_budget_and_a_second_clear_is_refused(personas: Personas) -> None:
    p = personas
    budget(p, max_in_flight=1)
    code, out, _ = run("clear", p.agent.slug, "inbox", "--json", "--as", "olive")
    assert code == 0 and json.loads(out)["cleared"] is True
    code, _, err = run("clear", p.agent.slug, "inbox", "--as", "olive")
    assert code == 1 and "not_found" in err


def test_if_version_writes_only_over_the_version_read(personas: Personas) -> None:
    p = personas
    code, _, err = run(
        "set",
        p.agent.slug,
        "inbox",
        "--max-in-flight",
        "1",
        "--if-version",
        "0" * 20,
        "--json",
        "--as",
        "olive",
    )
    assert code == 1 and json.loads(err)["code"] == "precondition_failed"
    assert not AdmissionPolicy.objects.exists()
    code, out, _ = run(
        "set",
        p.agent.slug,
        "inbox",
        "--max-in-flight",
        "1",
        "--if-version",
        "none",
        "--json",
        "--as",
        "olive",
    )
    assert code == 0
    read = json.loads(out)["policy"]["version"]
    code, _, err = run(
        "set",
        p.agent.slug,
        "inbox",
        "--max-in-flight",
        "2",
        "--if-version",
        "none",
        "--as",
        "olive",
    )
    assert code == 1 and "has a budget now" in err
    budget(p, max_in_flight=5)  # someone else's change
    for args in (("set", "--max-in-flight", "9"), ("clear",)):
        code, _, err = run(
            args[0], p.agent.slug, "inbox", *args[1:], "--if-version", read, "--as", "olive"
        )
        assert code == 1 and "changed since it was read" in err, args
    assert AdmissionPolicy.objects.get().max_in_flight == 5
    code, out, _ = run("show", p.agent.slug, "inbox", "--json", "--as", "olive")
    now = json.loads(out)["policies"][0]["policy"]["version"]
    code, _, _ = run("clear", p.agent.slug, "inbox", "--if-version", now, "--as", "olive")
    assert code == 0 and not AdmissionPolicy.objects.exists()


def test_a_window_flag_without_a_window_limit_is_a_usage_error(personas: Personas) -> None:
    code, _, _ = run("set", personas.agent.slug, "inbox", "--tz", "UTC", "--as", "olive")
    assert code == 2


def test_the_acting_human_must_be_settled(personas: Personas) -> None:
    code, _, _ = run("show", "--as", "nobody")
    assert code == 2


def manage(*args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "REDIS_URL": settings.REDIS_URL,
        "DJANGO_SETTINGS_MODULE": "switchboard.settings",
    }
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (["set", "{agent}", "inbox", "--per-day", "5", "--as", "olive"], 0),
        (["set", "{agent}", "inbox", "--per-day", "5", "--per-hour", "2", "--as", "olive"], 2),
        (["set", "{agent}", "inbox", "--per-day", "five", "--as", "olive"], 2),
        (["set", "{agent}", "inbox", "--per-day", "5", "--tz", "Nowhere", "--as", "olive"], 1),
        (["set", "{foreign}", "inbox", "--max-in-flight", "1", "--as", "olive"], 1),
        (["show", "--json", "--as", "olive"], 0),
        (["clear", "{agent}", "inbox", "--as", "olive"], 1),
        ([], 2),
    ],
)
def test_the_command_line_exit_codes(tx_personas: Personas, args: list[str], code: int) -> None:
    p = tx_personas
    argv = [a.format(agent=p.agent.slug, foreign=p.foreign.slug) for a in args]
    result = manage("queue", "budget", *argv)
    assert result.returncode == code, (result.stdout, result.stderr)


def test_ledger_verify_exit_codes_on_the_command_line(tx_personas: Personas) -> None:
    budget(tx_personas, max_in_flight=1)
    sound = manage("ledger", "verify", "--json")
    assert sound.returncode == 0, sound.stderr
    assert json.loads(sound.stdout)["ok"] is True
    AdmissionPolicy.objects.update(max_in_flight=50)
    drifted = manage("ledger", "verify")
    assert drifted.returncode == 3  # a finding: 2 is a usage error
    assert "changed_outside_audit" in drifted.stdout


def test_a_cron_job_tells_a_verify_finding_from_a_typo_by_the_exit_code(
    tx_personas: Personas,
) -> None:
    """2 is a usage error, 3 a finding: ``--expect garbage`` and a tampered ledger used to exit
    2 alike, so a cron job could not tell its own typo from tampering."""
    budget(tx_personas, max_in_flight=1)
    typo = manage("ledger", "verify", "--expect", "garbage")
    assert typo.returncode == 2 and "--expect" in typo.stderr, typo.stderr
    assert manage("limits", "verify", "--no-such-flag").returncode == 2
    # A well-formed anchor the ledger does not hold is a finding (the anchor's or the ledger's).
    stranger = manage("ledger", "verify", "--expect", "0:1:" + "0" * 64)
    assert stranger.returncode == 3, stranger.stderr
    assert "the anchor was mistyped or taken from another ledger" in stranger.stdout
    assert manage("ledger", "verify").returncode == 0

    AdmissionPolicy.objects.update(max_in_flight=50)  # behind the audit's back
    for command in ("ledger", "limits"):
        found = manage(command, "verify")
        assert found.returncode == 3, (command, found.stdout, found.stderr)
        assert "differ from the ledger" in found.stdout


def test_set_takes_stacked_windows_and_names_the_wrong_one(personas: Personas) -> None:
    p = personas
    code, out, _ = run(
        "set",
        p.agent.slug,
        "inbox",
        "--window",
        "100/hour@Europe/Berlin",
        "--window",
        "1000/day@Europe/Berlin",
        "--window",
        "5000/week@UTC@00:00@Mon",
        "--as",
        "olive",
    )
    assert code == 0, out
    assert "0/1000 per day from 00:00 Europe/Berlin" in out
    stored = AdmissionPolicy.objects.get()
    assert stored.max_claims_per_window == 100
    assert [w["limit"] for w in stored.extra_windows] == [1000, 5000]
    code, _, err = run(
        "set",
        p.agent.slug,
        "inbox",
        "--window",
        "5/day",
        "--window",
        "9/day@Moon/Base",
        "--json",
        "--as",
        "olive",
    )
    assert code == 1 and json.loads(err)["field"] == "windows[1].tz"
    assert [w["limit"] for w in AdmissionPolicy.objects.get().extra_windows] == [1000, 5000]


def test_a_malformed_if_version_is_refused_naming_the_option(personas: Personas) -> None:
    # "zzz" was sent on as a version and answered precondition_failed, "changed since it was
    # read… read it again": no version could ever be "zzz".
    p = personas
    budget(p, max_in_flight=2)
    for bad in ("zzz", "0" * 19, "G" * 20, ""):
        with pytest.raises(CommandError, match="argument --if-version: a version is 20 hex"):
            call_command(
                "queue",
                "budget",
                "set",
                p.agent.slug,
                "inbox",
                "--max-in-flight",
                "3",
                "--if-version",
                bad,
                "--as",
                "olive",
            )
    assert AdmissionPolicy.objects.get().max_in_flight == 2


def test_show_writes_a_window_reset_as_every_instant_is_written(personas: Personas) -> None:
    p = personas
    budget(p, per="hour", limit=5)
    code, out, _ = run("show", p.agent.slug, "inbox", "--as", "olive")
    assert code == 0
    [resets] = re.findall(r"resets (\S+)", out)
    assert resets.endswith("Z") and "+00:00" not in out


def test_if_version_takes_hex_digits_in_either_case(personas: Personas) -> None:
    p = personas
    budget(p, max_in_flight=2)
    code, out, _ = run("show", p.agent.slug, "inbox", "--json", "--as", "olive")
    version = json.loads(out)["policies"][0]["policy"]["version"]
    code, _, err = run(
        "set",
        p.agent.slug,
        "inbox",
        "--max-in-flight",
        "3",
        "--if-version",
        version.upper(),
        "--as",
        "olive",
    )
    assert code == 0, err
    assert AdmissionPolicy.objects.get().max_in_flight == 3
