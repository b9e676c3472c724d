"""Vend, revoke and token create/revoke from the shell land in the ledger like the same change
made on the web: under ``--as USER`` when given (their access applies), else under the system
actor ``system:cli``."""

from __future__ import annotations

from typing import Any

from queues import services
from switchboard.ledger import chain as ledger
from switchboard.ledger.models import LedgerEntry, LedgerKind
from tests.cli.test_cli import refusal, run
from tests.conftest import Personas


def last_row() -> LedgerEntry:
    return LedgerEntry.objects.order_by("-seq").first()  # type: ignore[return-value]


def vend(*extra: str) -> Any:
    return run(
        "endpoint", "vend", "--owner", "olive", "--name", "Shell", "--queues", "inbox", *extra
    )


def test_a_vend_and_revoke_from_the_shell_are_recorded_under_the_system_actor(
    personas: Personas,
) -> None:
    vended = vend()
    row = last_row()
    assert (row.kind, row.actor_human_name, row.actor_human_id) == (
        LedgerKind.ENDPOINT_VEND,
        "system:cli",
        None,
    )
    assert row.scope == f"endpoint:{vended['endpoint']['slug']}"
    after: Any = row.after
    assert after["owner"] == "olive"

    run("endpoint", "revoke", vended["endpoint"]["slug"])
    row = last_row()
    assert (row.kind, row.actor_human_name) == (LedgerKind.ENDPOINT_REVOKE, "system:cli")
    before: Any = row.before
    after = row.after
    assert before["state"] == "active" and after["state"] == "revoked"
    assert ledger.verify().ok


def test_as_user_names_the_acting_human_in_the_ledger(personas: Personas) -> None:
    vended = vend("--as", "olive")
    row = last_row()
    assert (row.kind, row.actor_human_name, row.actor_human_id) == (
        LedgerKind.ENDPOINT_VEND,
        "olive",
        personas.owner.pk,
    )
    run("endpoint", "revoke", vended["endpoint"]["slug"], "--as", "ada")
    assert (last_row().kind, last_row().actor_human_name) == (LedgerKind.ENDPOINT_REVOKE, "ada")


def test_as_user_applies_that_users_access_and_records_nothing_refused(
    personas: Personas,
) -> None:
    rows = LedgerEntry.objects.count()
    code, error = refusal(
        "endpoint", "vend", "--owner", "olive", "--name", "X", "--queues", "inbox", "--as", "otto"
    )
    assert (code, error["code"]) == (1, "forbidden")
    code, error = refusal("endpoint", "revoke", personas.agent.slug, "--as", "audrey")
    assert (code, error["code"]) == (1, "forbidden")
    assert LedgerEntry.objects.count() == rows


def test_token_create_and_revoke_from_the_shell_are_recorded(personas: Personas) -> None:
    created = run("token", "create", "--user", "olive", "--name", "laptop")
    row = last_row()
    assert (row.kind, row.actor_human_name, row.scope) == (
        LedgerKind.TOKEN_CREATE,
        "system:cli",
        "user:olive",
    )
    assert row.after == {"token_prefix": created["prefix"], "name": "laptop"}

    run("token", "revoke", str(created["id"]), "--as", "olive")
    row = last_row()
    assert (row.kind, row.actor_human_name, row.scope) == (
        LedgerKind.TOKEN_REVOKE,
        "olive",
        "user:olive",
    )


def test_a_token_for_someone_else_needs_a_superuser(personas: Personas) -> None:
    code, error = refusal("token", "create", "--user", "olive", "--as", "otto")
    assert (code, error["code"]) == (1, "forbidden")
    run("token", "create", "--user", "olive", "--as", "ada")
    assert (last_row().kind, last_row().actor_human_name) == (LedgerKind.TOKEN_CREATE, "ada")


def test_a_hook_secret_rotated_from_the_shell_is_printed_once_and_recorded(
    personas: Personas, settings: Any
) -> None:
    settings.HOOK_ALLOWED_NETWORKS = ["10.0.0.0/8"]
    p = personas
    services.endpoint_update(
        endpoint=p.agent, actor=p.as_human(p.owner), notify_url="http://10.0.0.7/hook"
    )
    old = p.agent.notify_secret
    rotated = run(
        "endpoint", "rotate-hook-secret", p.agent.slug, "--overlap", "600", "--as", "olive"
    )
    p.agent.refresh_from_db()
    assert rotated["hook_secret"] == p.agent.notify_secret != old
    assert p.agent.notify_secret_previous == old
    assert rotated["previous_secret_signs_until"] is not None
    row = last_row()
    assert (row.kind, row.actor_human_name) == (LedgerKind.ENDPOINT_HOOK_SECRET_ROTATE, "olive")
    assert old not in str(row.after) and p.agent.notify_secret not in str(row.after)

    code, error = refusal("endpoint", "rotate-hook-secret", p.agent.slug, "--overlap", "-5")
    assert (code, error["field"]) == (1, "overlap_seconds")
    assert last_row().seq == row.seq
