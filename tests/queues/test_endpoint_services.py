"""Endpoints and personal tokens change only through their services, each change in the ledger;
the admin deletes neither todos nor tokens."""

from __future__ import annotations

import pytest
from django.test import Client
from django.utils import timezone

from queues import selectors, services
from queues.admin import ENDPOINT_UPDATE_ARGUMENTS
from queues.models import Endpoint, HumanToken
from switchboard.core import versions
from switchboard.core.errors import Forbidden, InvalidArgument, PreconditionFailed
from switchboard.ledger import chain
from switchboard.ledger.models import LedgerEntry, LedgerKind
from tests.conftest import FIXTURE, Personas, push, run_threads


def _kinds() -> list[str]:
    return list(LedgerEntry.objects.order_by("seq").values_list("kind", flat=True))


def test_vend_update_and_revoke_each_leave_a_ledger_row_naming_the_human(
    personas: Personas,
) -> None:
    p = personas
    olive = p.as_human(p.owner)
    endpoint, _ = services.endpoint_vend(
        actor=olive, owner=p.owner, name="Audited", queues=["inbox"]
    )
    services.endpoint_update(endpoint=endpoint, actor=olive, name="Audited again")
    services.endpoint_revoke(endpoint=endpoint, actor=olive)

    rows = list(LedgerEntry.objects.filter(scope=f"endpoint:{endpoint.slug}").order_by("seq"))
    assert [r.kind for r in rows] == [
        LedgerKind.ENDPOINT_VEND,
        LedgerKind.ENDPOINT_UPDATE,
        LedgerKind.ENDPOINT_REVOKE,
    ]
    assert {r.actor_human_name for r in rows} == {"olive"}
    before, after = rows[1].before or {}, rows[1].after or {}
    assert before["name"] == "Audited" and after["name"] == "Audited again"
    assert "whsec_" not in str(rows[0].after) and "sbk_" not in str(rows[0].after)
    assert chain.verify().ok


def test_token_create_and_revoke_each_leave_a_ledger_row(personas: Personas) -> None:
    p = personas
    token, _ = services.human_token_create(user=p.owner, name="ci", actor=p.as_human(p.owner))
    assert services.human_token_revoke(token=token, actor=p.as_human(p.owner))
    assert _kinds()[-2:] == [LedgerKind.TOKEN_CREATE, LedgerKind.TOKEN_REVOKE]


def test_an_update_that_changes_nothing_leaves_no_row(personas: Personas) -> None:
    before = LedgerEntry.objects.count()
    services.endpoint_update(
        endpoint=personas.agent, actor=personas.as_human(personas.owner), name="Agent"
    )
    assert LedgerEntry.objects.count() == before


def test_only_the_owner_or_a_superuser_changes_an_endpoint(personas: Personas) -> None:
    p = personas
    with pytest.raises(Forbidden):
        services.endpoint_update(endpoint=p.agent, actor=p.as_human(p.other_owner), name="Mine")
    with pytest.raises(Forbidden):
        services.endpoint_update(endpoint=p.agent, actor=p.as_human(p.auditor), name="Mine")
    with pytest.raises(Forbidden):
        services.endpoint_update(endpoint=p.agent, actor=p.as_human(p.owner), owner=p.other_owner)
    with pytest.raises(Forbidden):
        services.endpoint_revoke(endpoint=p.agent, actor=p.as_human(p.other_owner))
    services.endpoint_update(endpoint=p.agent, actor=p.as_human(p.admin), owner=p.other_owner)
    p.agent.refresh_from_db()
    assert p.agent.owner_id == p.other_owner.pk


def test_a_bad_update_names_the_field_and_changes_nothing(personas: Personas) -> None:
    p = personas
    with pytest.raises(InvalidArgument) as exc:
        services.endpoint_update(endpoint=p.agent, actor=p.as_human(p.owner), name=" ")
    assert exc.value.details["field"] == "name"
    p.agent.refresh_from_db()
    assert p.agent.name == "Agent"


def test_the_admin_deletes_neither_todos_nor_tokens(personas: Personas) -> None:
    p = personas
    (todo,) = push(p, 1)
    token, _ = services.human_token_create(actor=FIXTURE, user=p.owner, name="ci")
    client = Client()
    client.force_login(p.admin)
    assert client.get(f"/admin/queues/todo/{todo.pk}/delete/").status_code == 403
    assert client.get(f"/admin/queues/humantoken/{token.pk}/delete/").status_code == 403
    # Nor is a token given to someone else through its change form.
    client.post(
        f"/admin/queues/humantoken/{token.pk}/change/", {"user": p.other_owner.pk, "name": "x"}
    )
    assert HumanToken.objects.get(pk=token.pk).user_id == p.owner.pk


def test_an_update_over_a_version_changes_only_the_endpoint_as_read(personas: Personas) -> None:
    """The version of what may change after vend (selectors.endpoint_version): the admin's change
    form carries it; a write over another is refused, naming who changed it, and writes
    nothing."""
    p = personas
    read = selectors.endpoint_version(p.agent)
    # The same endpoint as vended (rps given as 0) and as read back (0.0): one version.
    assert read == selectors.endpoint_version(Endpoint.objects.get(pk=p.agent.pk))
    assert set(selectors.ENDPOINT_EDITABLE) == set(ENDPOINT_UPDATE_ARGUMENTS)
    services.endpoint_update(endpoint=p.agent, actor=p.as_human(p.admin), name="Renamed")
    with pytest.raises(PreconditionFailed) as refused:
        services.endpoint_update(
            endpoint=p.agent, actor=p.as_human(), rps=5.0, expected=versions.named(read)
        )
    assert "last changed by ada" in refused.value.message
    assert refused.value.details["version"] == selectors.endpoint_version(
        Endpoint.objects.get(pk=p.agent.pk)
    )
    assert Endpoint.objects.get(pk=p.agent.pk).rate_limit_rps == p.agent.rate_limit_rps
    now = refused.value.details["version"]
    done = services.endpoint_update(
        endpoint=p.agent, actor=p.as_human(), rps=5.0, expected=versions.named(now)
    )
    assert done.rate_limit_rps == 5.0
    # Work moves last_seen_at, not the version.
    before = selectors.endpoint_version(done)
    Endpoint.objects.filter(pk=done.pk).update(last_seen_at=timezone.now())
    assert selectors.endpoint_version(Endpoint.objects.get(pk=done.pk)) == before


def test_racing_updates_over_one_version_land_exactly_one(tx_personas: Personas) -> None:
    """Eight writers read the same version and write at once: the row lock orders them, the
    first lands and the other seven find the version moved on."""
    p = tx_personas
    read = versions.named(selectors.endpoint_version(p.agent))

    def update(i: int) -> str:
        try:
            services.endpoint_update(
                endpoint=p.agent, actor=p.as_human(), name=f"Writer {i}", expected=read
            )
        except PreconditionFailed:
            return "refused"
        return "landed"

    outcomes = run_threads(8, update)
    assert sorted(outcomes) == ["landed"] + ["refused"] * 7
    name = Endpoint.objects.get(pk=p.agent.pk).name
    assert name == f"Writer {outcomes.index('landed')}"
    changes = LedgerEntry.objects.filter(kind=LedgerKind.ENDPOINT_UPDATE, scope="endpoint:agent")
    assert changes.count() == 1


def test_every_surface_keeps_the_scopes_and_token_names_bounds(personas: Personas) -> None:
    """The API's schema bounded a scope at 100 queues and HumanToken's column a name at 100
    characters; the CLI, through the services alone, vended 500 queues and cut a 300-character
    token name to 100 without a word."""
    p = personas
    before = _kinds()
    with pytest.raises(InvalidArgument) as many:
        services.endpoint_vend(
            actor=FIXTURE, owner=p.owner, name="Wide", queues=[f"q{i}" for i in range(101)]
        )
    assert many.value.field == "queues" and "101" in many.value.message
    with pytest.raises(InvalidArgument) as long:
        services.human_token_create(actor=FIXTURE, user=p.owner, name="n" * 101)
    assert long.value.field == "name" and "101" in long.value.message
    assert _kinds() == before and not Endpoint.objects.filter(name="Wide").exists()
    services.endpoint_vend(
        actor=FIXTURE, owner=p.owner, name="Wide", queues=[f"q{i}" for i in range(100)]
    )
    token, _ = services.human_token_create(actor=FIXTURE, user=p.owner, name=" " * 3)
    assert token.name == "api"  # blank is the default, not an empty name
    token, _ = services.human_token_create(actor=FIXTURE, user=p.owner, name="n" * 100)
    assert token.name == "n" * 100


def test_nothing_new_is_made_for_a_deactivated_person(personas: Personas) -> None:
    """Their token would be refused at every use, and their endpoint would serve for someone
    nobody can sign in as."""
    p = personas
    p.owner.is_active = False
    p.owner.save(update_fields=["is_active"])
    before = (_kinds(), HumanToken.objects.count(), Endpoint.objects.count())
    with pytest.raises(InvalidArgument) as vend:
        services.endpoint_vend(actor=FIXTURE, owner=p.owner, name="Ghost", queues=["inbox"])
    assert vend.value.field == "owner" and "deactivated" in vend.value.message
    with pytest.raises(InvalidArgument) as token:
        services.human_token_create(actor=FIXTURE, user=p.owner, name="ghost")
    assert token.value.field == "user" and "deactivated" in token.value.message
    assert (_kinds(), HumanToken.objects.count(), Endpoint.objects.count()) == before
