"""``manage.py limits``: set, list and delete the named limits, each write a ledger row, bad
input refused naming its field with nothing changed."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from admission.limits.models import Pool, QueueSettings, RateLimit, TagLimit
from switchboard.ledger import chain
from switchboard.ledger.models import LedgerKind
from tests.conftest import Personas, audit_rows, push
from tests.limits.conftest import pool, rate


def limits(*args: str) -> str:
    out = StringIO()
    call_command("limits", *args, stdout=out, stderr=StringIO())
    return out.getvalue()


def refusal(*args: str) -> dict[str, object]:
    err = StringIO()
    with pytest.raises(CommandError) as exc:
        call_command("limits", *args, "--json", stdout=StringIO(), stderr=err)
    assert exc.value.returncode == 1
    return json.loads(err.getvalue())


def test_an_operator_declares_changes_and_lists_each_kind(personas: Personas) -> None:
    limits("set", "pool", "gpu", "--slots", "4", "--as", "ada")
    limits("set", "tag", "vendor.a", "--limit", "2", "--posture", "advise", "--as", "ada")
    limits("set", "rate", "openai", "--base-limit", "60", "--floor", "5", "--as", "ada")
    limits("set", "pool", "gpu", "--posture", "advise", "--as", "ada")
    assert Pool.objects.get().slots == 4 and Pool.objects.get().posture == "advise"
    assert TagLimit.objects.get().limit == 2
    rate = RateLimit.objects.get()
    assert (rate.base_limit, rate.floor, rate.decay_window_seconds) == (60, 5, 300)
    assert rate.decay_step == 1  # one halving per 429, unless told otherwise
    limits("set", "rate", "openai", "--decay-step", "2", "--as", "ada")
    assert RateLimit.objects.get().decay_step == 2
    listed = json.loads(limits("list", "--json"))
    assert [(x["kind"], x["name"]) for x in listed] == [
        ("pool", "gpu"),
        ("tag", "vendor.a"),
        ("rate", "openai"),
    ]
    assert "pool gpu: slots=4 (advise)" in limits("list")


def test_every_change_is_a_ledger_row_naming_who_and_what_changed(personas: Personas) -> None:
    limits("set", "pool", "gpu", "--slots", "4", "--as", "ada")
    limits("set", "pool", "gpu", "--slots", "4", "--as", "ada")  # no change: no row
    limits("set", "pool", "gpu", "--slots", "2", "--as", "ada")
    limits("delete", "pool", "gpu", "--as", "ada")
    rows = list(audit_rows().filter(scope="limits").order_by("seq"))
    assert [r.kind for r in rows] == [
        LedgerKind.LIMITS_SET,
        LedgerKind.LIMITS_SET,
        LedgerKind.LIMITS_DELETE,
    ]
    assert rows[1].before == {"kind": "pool", "name": "gpu", "slots": 4, "posture": "enforce"}
    assert rows[1].after == {"kind": "pool", "name": "gpu", "slots": 2, "posture": "enforce"}
    assert rows[2].after is None and {r.actor_human_name for r in rows} == {"ada"}
    assert chain.verify().ok


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["set", "pool", "Bad Name", "--slots", "1"], "name"),
        (["set", "pool", "gpu"], "slots"),
        (["set", "pool", "gpu", "--slots", "-1"], "slots"),
        (["set", "pool", "gpu", "--slots", "1", "--limit", "2"], "limit"),
        (["set", "tag", "t", "--limit", "2000000"], "limit"),
        (["set", "rate", "r", "--base-limit", "0"], "base_limit"),
        (["set", "rate", "r", "--base-limit", "4", "--floor", "5"], "floor"),
        (["set", "rate", "r", "--base-limit", "4", "--decay-window", "0"], "decay_window_seconds"),
        (["set", "rate", "r", "--base-limit", "4", "--decay-step", "17"], "decay_step"),
        (["delete", "tag", "nope"], "name"),
    ],
)
def test_bad_input_is_refused_naming_the_field_and_changes_nothing(
    personas: Personas, args: list[str], field: str
) -> None:
    before = audit_rows().count()
    assert refusal(*args, "--as", "ada")["field"] == field
    assert not Pool.objects.exists() and not TagLimit.objects.exists()
    assert not RateLimit.objects.exists() and audit_rows().count() == before


def test_a_limit_live_work_names_is_not_deleted(personas: Personas) -> None:
    pool("gpu", slots=1)
    push(personas, 1, pool="gpu")
    error = refusal("delete", "pool", "gpu", "--as", "ada")
    assert error["code"] == "conflict" and error["live_todos"] == 1
    assert str(error["error"]).endswith("set it to 0 to hold them instead")
    assert Pool.objects.filter(name="gpu").exists()
    # A rate limit has no 0 to hold them with: the advice was one its set then refused.
    rate("r1", 3)
    push(personas, 1, rate_limit="r1")
    error = refusal("delete", "rate", "r1", "--as", "ada")
    assert error["code"] == "conflict" and str(error["error"]).endswith("end or discard them first")
    assert RateLimit.objects.filter(name="r1").exists()


def test_an_auditor_or_owner_changes_no_fleet_wide_limit(personas: Personas) -> None:
    for user in ("audrey", "olive"):
        assert refusal("set", "pool", "gpu", "--slots", "1", "--as", user)["code"] == "forbidden"
    assert not Pool.objects.exists()


@pytest.mark.parametrize(
    ("command", "args", "listing"),
    [
        ("limits", ["set", "pool", "gpu", "--slots", "1"], "limits list --json"),
        ("queue", ["budget", "set", "agent", "inbox", "--max-in-flight", "1"], "queue budget show --json"),
    ],
)  # fmt: skip
def test_a_version_that_is_none_is_a_usage_error_naming_the_listing_that_prints_them(
    personas: Personas, command: str, args: list[str], listing: str
) -> None:
    # It said "as show --json prints it" of a limit too, where no limits show exists.
    with pytest.raises(CommandError) as refused:
        call_command(command, *args, "--if-version", "garbage", "--as", "ada", stderr=StringIO())
    said = str(refused.value)
    assert "--if-version" in said and "a version is 20 hex digits, or 'none'" in said
    assert said.endswith(f"{listing} prints them"), said
    assert not Pool.objects.exists()


def test_a_write_over_the_version_read_is_refused_once_the_limit_moved(personas: Personas) -> None:
    # The CLI wrote whatever was there; with --if-version it writes over the limit as read, or
    # nothing (the API's If-Match, the version list --json prints).
    limits("set", "pool", "gpu", "--slots", "4", "--if-version", "none", "--as", "ada")
    assert (
        refusal("set", "pool", "gpu", "--slots", "5", "--if-version", "none", "--as", "ada")["code"]
        == "precondition_failed"
    )
    (read,) = json.loads(limits("list", "--json"))
    limits("pool", "create", "gpu", "--slots", "6", "--as", "ada")  # someone else's change
    (now,) = json.loads(limits("list", "--json"))
    stale = refusal(
        "set", "pool", "gpu", "--slots", "3", "--if-version", read["version"], "--as", "ada"
    )
    assert stale["code"] == "precondition_failed" and stale["version"] == now["version"]
    gone = refusal("delete", "pool", "gpu", "--if-version", read["version"], "--as", "ada")
    assert gone["code"] == "precondition_failed"
    assert Pool.objects.get().slots == 6
    written = json.loads(
        limits("set", "pool", "gpu", "--slots", "3", "--if-version", now["version"], "--as", "ada",
               "--json")
    )  # fmt: skip
    assert written["slots"] == 3 and written["version"] != now["version"]
    limits("delete", "pool", "gpu", "--if-version", written["version"], "--as", "ada")
    assert not Pool.objects.exists()


def test_a_queue_s_priority_is_written_over_the_version_read(personas: Personas) -> None:
    limits("queue", "create", "inbox", "--priority", "2", "--if-version", "none", "--as", "ada")
    again = refusal(
        "queue", "create", "inbox", "--priority", "3", "--if-version", "none", "--as", "ada"
    )
    assert again["code"] == "precondition_failed"
    (read,) = json.loads(limits("status", "--json"))["queues"]
    limits("queue", "create", "inbox", "--priority", "4", "--as", "ada")  # someone else's change
    stale = refusal(
        "queue",
        "create",
        "inbox",
        "--priority",
        "5",
        "--if-version",
        read["version"],
        "--as",
        "ada",
    )
    assert stale["code"] == "precondition_failed" and stale["version"] != read["version"]
    assert QueueSettings.objects.get(queue="inbox").priority == 4
