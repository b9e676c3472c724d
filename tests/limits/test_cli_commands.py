"""``manage.py limits`` as the seed spells it: pool/tag/rate/queue declarations, queue pause,
quarantine, status and verify (exit 0 / 3, a finding, like ``ledger verify``)."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from admission.limits import services as limit_services
from admission.limits.models import Pool, QueueSettings, RateLimit, TagLimit
from queues import services
from queues.models import QueuePause, Todo, TodoState
from queues.services import Claimed
from switchboard.ledger.models import LedgerEntry, LedgerKind
from tests.admission.test_ledger import run_verify
from tests.conftest import Personas, audit_rows
from tests.limits.conftest import push_named


def limits(*args: str) -> str:
    out = StringIO()
    call_command("limits", *args, stdout=out, stderr=StringIO())
    return out.getvalue()


def failing(*args: str) -> tuple[int, str, str]:
    out, err = StringIO(), StringIO()
    with pytest.raises(CommandError) as exc:
        call_command("limits", *args, stdout=out, stderr=err)
    return int(exc.value.returncode), out.getvalue(), err.getvalue()


def test_the_seed_commands_declare_every_kind_and_status_shows_them(personas: Personas) -> None:
    limits("pool", "create", "gpu", "--slots", "2", "--as", "ada")
    limits("tag", "set", "vendor.a", "--limit", "3", "--posture", "advise", "--as", "ada")
    limits("rate", "set", "openai", "--base-limit", "8", "--floor", "2", "--decay-window", "60",
           "--as", "ada")  # fmt: skip
    limits("queue", "create", "inbox", "--priority", "5", "--aging", "30", "--as", "ada")
    push_named(personas, 2, pool="gpu", tags=["vendor.a"], rate_limit="openai")
    assert isinstance(services.claim_next(actor=personas.as_agent()), Claimed)

    status = json.loads(limits("status", "--json"))
    gpu = {"kind": "pool", "name": "gpu", "slots": 2, "posture": "enforce"}
    assert status["pools"] == [gpu | {"held": 1, "version": limit_services.limit_version(gpu)}]
    assert [(t["name"], t["limit"], t["held"], t["posture"]) for t in status["tags"]] == [
        ("vendor.a", 3, 1, "advise")
    ]
    [rate] = status["rates"]
    assert (rate["base_limit"], rate["effective_limit"], rate["observations"]) == (8, 8, 0)
    [settings] = status["queues"]
    version = settings["version"]
    assert settings == {"queue": "inbox", "priority": 5, "aging_seconds": 30, "version": version}
    assert len(version) == 20
    assert (status["grants"], status["waivers"]) == (1, 0)
    assert status["quarantines"] == {"in_force": [], "recorded": 0}
    assert "pool gpu: 1/2 held (enforce)" in limits("status")
    assert "grants held: 1;" in limits("status")
    assert RateLimit.objects.get().decay_window_seconds == 60
    kinds = list(audit_rows().values_list("kind", flat=True))
    assert kinds.count(LedgerKind.LIMITS_SET) == 3 and kinds.count(LedgerKind.LIMITS_QUEUE) == 1


def test_bad_input_is_refused_naming_the_field_with_nothing_changed(personas: Personas) -> None:
    code, _, err = failing("pool", "create", "gpu", "--slots", "-1", "--json", "--as", "ada")
    assert code == 1 and json.loads(err)["field"] == "slots"
    code, _, err = failing("queue", "create", "inbox", "--aging", "0", "--json", "--as", "ada")
    assert code == 1 and json.loads(err)["field"] == "aging_seconds"
    code, _, err = failing("queue", "create", "No Good", "--json", "--as", "ada")
    assert code == 1 and json.loads(err)["field"] == "queue"
    code, _, err = failing("rate", "set", "openai", "--base-limit", "2", "--floor", "3", "--json",
                           "--as", "ada")  # fmt: skip
    assert code == 1 and json.loads(err)["field"] == "floor"
    assert not Pool.objects.exists() and not QueueSettings.objects.exists()
    assert not RateLimit.objects.exists()
    assert not audit_rows().exists()


def test_queue_pause_refuses_an_unknown_name_and_pauses_and_resumes_a_declared_one(
    personas: Personas,
) -> None:
    code, _, err = failing("queue", "pause", "nowhere", "--as", "ada")
    assert code == 1 and not QueuePause.objects.exists()
    assert "--create on the CLI" in err  # and this command takes it
    assert "paused nowhere" in limits("queue", "pause", "nowhere", "--create", "--as", "ada")
    limits("queue", "pause", "nowhere", "--resume", "--as", "ada")
    # Contradictory flags are a usage error, not a silent choice between them.
    with pytest.raises(CommandError, match="not allowed with argument"):
        limits("queue", "create", "batch", "--aging", "10", "--no-aging", "--as", "ada")
    assert not QueueSettings.objects.exists()
    limits("queue", "create", "batch", "--as", "ada")
    assert "paused batch" in limits("queue", "pause", "batch", "--as", "ada")
    assert QueuePause.objects.filter(queue="batch").exists()
    assert "resumed batch" in limits("queue", "pause", "batch", "--resume", "--as", "ada")
    assert not QueuePause.objects.exists()


def test_quarantine_from_the_cli_expires_claims_and_status_counts_it(personas: Personas) -> None:
    limits("tag", "set", "vendor.a", "--limit", "4", "--as", "ada")
    push_named(personas, 3, tags=["vendor.a"])
    services.claim_next(actor=personas.as_agent())
    out = json.loads(limits("quarantine", "tag", "vendor.a", "--json", "--as", "ada"))
    assert len(out["manifest"]["expired"]) == 1 and len(out["manifest"]["queued"]) == 2
    assert TagLimit.objects.get().limit == 0
    assert Todo.objects.filter(state=TodoState.CLAIMED).count() == 0
    status = json.loads(limits("status", "--json"))
    assert status["quarantines"] == {"in_force": ["tag:vendor.a"], "recorded": 1}


def test_verify_passes_a_sound_ledger_and_fails_closed_at_the_tampered_row(
    personas: Personas,
) -> None:
    limits("pool", "create", "gpu", "--slots", "1", "--as", "ada")
    push_named(personas, 2, pool="gpu")
    services.claim_next(actor=personas.as_agent())
    assert json.loads(limits("verify", "--json"))["ok"] is True
    row = audit_rows().get(kind=LedgerKind.LIMITS_SET)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE admission_ledgerentry SET after = jsonb_set(after, '{slots}', '9') "
            "WHERE seq = %s",
            [row.seq],
        )
    code, out, _ = failing("verify", "--json")
    report = json.loads(out)
    assert code == 3 and report["ok"] is False
    assert report["ledger"]["chain"]["problem"]["seq"] == row.seq
    assert report["ledger"]["chain"]["problem"]["problem"] == "mutated"


def test_verify_names_a_grant_the_enforced_limit_in_force_would_have_refused(
    personas: Personas,
) -> None:
    limits("pool", "create", "gpu", "--slots", "1", "--as", "ada")
    first, second = push_named(personas, 2, pool="gpu")
    services.claim(actor=personas.as_agent(), todo_id=first.id)
    # Raised behind the ledger's back, so the second grant is over the limit in force.
    Pool.objects.filter(name="gpu").update(slots=2)
    services.claim(actor=personas.as_agent(), todo_id=second.id)

    code, out, _ = failing("verify", "--json")
    report = json.loads(out)
    assert code == 3 and report["grants"] == 2
    # The raise itself is the ledger's finding: the pool differs from its audited state.
    [changed] = report["ledger"]["drift"]
    assert (changed["limit"], changed["problem"]) == ("limits/pool gpu", "changed_outside_audit")
    assert (changed["kind"], changed["name"]) == ("pool", "gpu")  # "queue" read "pool gpu"
    assert changed["detail"].endswith("slots audited 1, now 2")
    [drift] = report["grant_drift"]
    assert (drift["todo"], drift["problem"], drift["limit"], drift["held"]) == (
        str(second.id),
        "over_enforced_limit",
        1,
        1,
    )
    assert "pool gpu: todo" in failing("verify")[1]
    assert LedgerEntry.objects.filter(kind=LedgerKind.LIMITS_SET).count() == 1


def test_verify_accepts_an_advise_excess_that_carries_its_waiver(personas: Personas) -> None:
    limits("pool", "create", "gpu", "--slots", "1", "--posture", "advise", "--as", "ada")
    push_named(personas, 2, pool="gpu")
    services.claim_next(actor=personas.as_agent())
    services.claim_next(actor=personas.as_agent())
    assert audit_rows().filter(kind=LedgerKind.LIMITS_WAIVER).count() == 1
    report = json.loads(limits("verify", "--json"))
    assert report["ok"] is True and report["grants"] == 2 and report["grant_drift"] == []
    # The same excess with its waiver row gone from the replay's view is drift.
    LedgerEntry.objects.filter(kind=LedgerKind.LIMITS_WAIVER).update(kind=LedgerKind.LIMITS_SET)
    code, out, _ = failing("verify", "--json")
    problems = {d["problem"] for d in json.loads(out)["grant_drift"]}
    assert code == 3 and problems == {"unwaived_excess"}


def test_status_counts_the_grants_held_not_the_claims_naming_a_limit(personas: Personas) -> None:
    limits("pool", "create", "gpu", "--slots", "2", "--as", "ada")
    limits("pool", "create", "cpu", "--slots", "2", "--posture", "off", "--as", "ada")
    push_named(personas, 1, pool="gpu")
    push_named(personas, 1, pool="cpu")
    granted, ungated = (services.claim_next(actor=personas.as_agent()) for _ in range(2))
    assert isinstance(granted, Claimed) and isinstance(ungated, Claimed)
    assert granted.grant is not None and ungated.grant is None

    assert json.loads(limits("status", "--json"))["grants"] == 1
    services.complete(actor=personas.as_agent(), todo_id=granted.todo.id)
    assert json.loads(limits("status", "--json"))["grants"] == 0


@pytest.mark.parametrize(
    "change",
    [
        "UPDATE limits_pool SET posture = 'off' WHERE name = 'gpu'",
        "UPDATE limits_pool SET slots = 99 WHERE name = 'gpu'",
        "DELETE FROM limits_pool WHERE name = 'gpu'",
        """INSERT INTO limits_taglimit (tag, "limit", posture, created_at, updated_at)
        VALUES ('new', 1, 'enforce', now(), now())""",
        "UPDATE limits_queuesettings SET priority = 9 WHERE queue = 'inbox'",
    ],
    ids=["posture-off", "slots", "deleted", "made", "priority"],
)
def test_a_limit_changed_outside_the_audited_path_is_a_finding_of_both_verifies(
    personas: Personas, change: str
) -> None:
    # A pool set to off in the database let claims through with no grant and no finding of
    # either verify, while the same change to a budget was drift.
    limits("pool", "create", "gpu", "--slots", "1", "--as", "ada")
    limits("queue", "create", "inbox", "--priority", "1", "--as", "ada")
    limits("verify")  # sound
    with connection.cursor() as cursor:
        cursor.execute(change)
    code, out, _ = failing("verify", "--json")
    assert code == 3
    [drift] = json.loads(out)["ledger"]["drift"]
    assert drift["problem"] in {"changed_outside_audit", "deleted_outside_audit", "no_create_row"}
    ledger_code, ledger_out = run_verify("--json")
    assert ledger_code == 3 and json.loads(ledger_out)["drift"] == [drift]
