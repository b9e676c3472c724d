"""The endpoint's vend and change forms in the admin: a value the service refuses is refused
beside its field in the service's words (the inputs offer what it accepts), and a change form
saves only over the endpoint it showed."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.test import Client

from queues import services
from queues.models import Endpoint
from switchboard.ledger.models import LedgerEntry
from tests.conftest import Personas, push

TTL_REFUSED = "lease_ttl_seconds must be between 1 and 86400"
RPS_REFUSED = "rps must be between 0 (unlimited) and 100000"


def _client(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _row_errors(html: str, field: str) -> list[str]:
    """The errors shown in the field's own row of the admin form."""
    row = re.search(rf'<div class="form-row[^"]*\bfield-{field}\b[^"]*">(.*?)</div>', html, re.S)
    assert row, field
    return re.findall(r"<li>(.*?)</li>", row.group(1))


def _form_errors(html: str) -> list[str]:
    """The errors above the form (those naming no field)."""
    return re.findall(r'<ul class="errorlist nonfield"[^>]*>\s*<li>(.*?)</li>', html)


def _input(html: str, name: str) -> str:
    match = re.search(rf'<input[^>]*\bname="{name}"[^>]*>', html)
    assert match, name
    return match.group(0)


def _as_shown(response: Any) -> dict[str, Any]:
    """What the change page's form would post unchanged (each field as shown, the version too)."""
    form = response.context["adminform"].form
    return {name: "" if form[name].value() is None else form[name].value() for name in form.fields}


BURST_REFUSED = "burst must be between 1 and 1000000"
VEND = {"name": "Ranges", "queues": "inbox", "verbs": ["claim_next"]}


@pytest.mark.parametrize(
    ("field", "value", "refusal"),
    [
        ("default_lease_ttl_seconds", "0", TTL_REFUSED),
        ("default_lease_ttl_seconds", "86401", TTL_REFUSED),
        ("default_lease_ttl_seconds", "90000", TTL_REFUSED),
        ("default_lease_ttl_seconds", "-1", TTL_REFUSED),
        ("rate_limit_rps", "-1", RPS_REFUSED),
        ("rate_limit_rps", "100001", RPS_REFUSED),
        ("rate_limit_burst", "0", BURST_REFUSED),
        ("rate_limit_burst", "1000001", BURST_REFUSED),
    ],
)
def test_a_vend_out_of_range_is_refused_beside_its_field_in_the_services_words(
    personas: Personas, field: str, value: str, refusal: str
) -> None:
    # Was "Constraint “endpoint_lease_ttl_range” is violated." above the form.
    p = personas
    entries = LedgerEntry.objects.count()
    response = _client(p.admin).post(
        "/admin/queues/endpoint/add/", {**VEND, "owner": p.owner.pk, field: value}
    )
    assert response.status_code == 200
    html = response.content.decode()
    assert _row_errors(html, field) == [refusal]
    assert _form_errors(html) == [] and "Constraint" not in html
    assert not Endpoint.objects.filter(name="Ranges").exists()
    assert LedgerEntry.objects.count() == entries


@pytest.mark.parametrize(
    ("field", "value", "refusal"),
    [
        ("default_lease_ttl_seconds", "0", TTL_REFUSED),
        ("default_lease_ttl_seconds", "86401", TTL_REFUSED),
        ("rate_limit_rps", "-1", RPS_REFUSED),
        ("rate_limit_rps", "100001", RPS_REFUSED),
        ("rate_limit_burst", "0", BURST_REFUSED),
        ("rate_limit_burst", "1000001", BURST_REFUSED),
        ("rate_limit_burst", "4294967296", BURST_REFUSED),
    ],
)
def test_a_change_out_of_range_is_refused_beside_its_field_and_writes_nothing(
    personas: Personas, field: str, value: str, refusal: str
) -> None:
    p = personas
    client = _client(p.admin)
    url = f"/admin/queues/endpoint/{p.agent.pk}/change/"
    shown = _as_shown(client.get(url))
    entries = LedgerEntry.objects.count()
    response = client.post(url, {**shown, field: value})
    assert response.status_code == 200
    html = response.content.decode()
    assert _row_errors(html, field) == [refusal]
    assert _form_errors(html) == [] and "Constraint" not in html
    p.agent.refresh_from_db()
    assert (p.agent.default_lease_ttl_seconds, p.agent.rate_limit_rps) == (None, 0.0)
    assert LedgerEntry.objects.count() == entries


def test_the_inputs_offer_the_range_the_service_accepts_and_its_ends_are_taken(
    personas: Personas,
) -> None:
    p = personas
    client = _client(p.admin)
    url = f"/admin/queues/endpoint/{p.agent.pk}/change/"
    for page in (client.get("/admin/queues/endpoint/add/"), client.get(url)):
        html = page.content.decode()
        ttl = _input(html, "default_lease_ttl_seconds")
        assert 'min="1"' in ttl and 'max="86400"' in ttl, ttl
        rps = _input(html, "rate_limit_rps")
        assert 'min="0"' in rps and 'max="100000"' in rps, rps
    for page in (client.get("/admin/queues/endpoint/add/"), client.get(url)):
        burst = _input(page.content.decode(), "rate_limit_burst")
        assert 'min="1"' in burst and 'max="1000000"' in burst, burst
    for ttl, rps in (("1", "0"), ("86400", "100000")):
        response = client.post(
            url,
            {**_as_shown(client.get(url)), "default_lease_ttl_seconds": ttl, "rate_limit_rps": rps},
        )
        assert response.status_code == 302, _form_errors(response.content.decode())
        p.agent.refresh_from_db()
        assert (p.agent.default_lease_ttl_seconds, p.agent.rate_limit_rps) == (int(ttl), float(rps))
    response = client.post(
        "/admin/queues/endpoint/add/",
        {
            **VEND,
            "owner": p.owner.pk,
            "default_lease_ttl_seconds": "86400",
            "rate_limit_rps": "0",
            "rate_limit_burst": "1000000",
        },
    )
    assert response.status_code == 302
    vended = Endpoint.objects.get(name="Ranges")
    assert (vended.default_lease_ttl_seconds, vended.rate_limit_rps) == (86400, 0.0)
    assert vended.rate_limit_burst == 1000000  # the vend form takes a burst, as the CLI does


def test_a_change_form_opened_before_anothers_save_is_refused_and_writes_nothing(
    personas: Personas,
) -> None:
    # Two tabs on one endpoint: A renames it; B, opened before, changes only the rate. B's save
    # posted the old name with it, and silently put it back.
    p = personas
    url = f"/admin/queues/endpoint/{p.agent.pk}/change/"
    tab_a, tab_b = _client(p.admin), _client(p.admin)
    shown_a, shown_b = _as_shown(tab_a.get(url)), _as_shown(tab_b.get(url))
    assert tab_a.post(url, {**shown_a, "name": "Renamed in A"}).status_code == 302
    entries = LedgerEntry.objects.count()

    response = tab_b.post(url, {**shown_b, "rate_limit_rps": "9"})
    assert response.status_code == 200
    (refusal,) = _form_errors(response.content.decode())
    assert refusal.startswith(
        f"endpoint {p.agent.slug} changed since it was read (last changed by ada at "
    )
    assert refusal.endswith("): nothing was written; read it again to see the change")
    p.agent.refresh_from_db()
    assert (p.agent.name, p.agent.rate_limit_rps) == ("Renamed in A", 0.0)
    assert LedgerEntry.objects.count() == entries

    # Opened again, it shows A's name and saves over it.
    again = _as_shown(tab_b.get(url))
    assert again["name"] == "Renamed in A"
    assert tab_b.post(url, {**again, "rate_limit_rps": "9"}).status_code == 302
    p.agent.refresh_from_db()
    assert (p.agent.name, p.agent.rate_limit_rps) == ("Renamed in A", 9.0)


def test_a_change_made_elsewhere_names_who_made_it_and_work_does_not_stale_the_form(
    personas: Personas,
) -> None:
    p = personas
    url = f"/admin/queues/endpoint/{p.agent.pk}/change/"
    client = _client(p.admin)
    shown = _as_shown(client.get(url))
    # The endpoint's work (a claim sets last_seen_at) is not a change of what the form edits.
    (todo,) = push(p, 1)
    services.claim(actor=p.as_agent(), todo_id=todo.id)
    assert client.post(url, {**shown, "rate_limit_burst": "7"}).status_code == 302

    shown = _as_shown(client.get(url))
    services.endpoint_update(endpoint=p.agent, actor=p.as_human(p.owner), notify_url="")
    assert client.post(url, {**shown, "rate_limit_burst": "8"}).status_code == 302  # no change
    services.endpoint_update(endpoint=p.agent, actor=p.as_human(p.owner), name="Olive's")
    response = client.post(url, {**shown, "rate_limit_burst": "9"})
    (refusal,) = _form_errors(response.content.decode())
    assert "(last changed by olive at " in refusal
    p.agent.refresh_from_db()
    assert (p.agent.name, p.agent.rate_limit_burst) == ("Olive's", 8)


def test_a_read_only_change_page_shows_no_version(personas: Personas) -> None:
    # The version is what a save writes over; a page that saves nothing does not show it.
    p = personas
    p.auditor.is_staff = True
    p.auditor.save()
    response = _client(p.auditor).get(f"/admin/queues/endpoint/{p.agent.pk}/change/")
    assert response.status_code == 200
    html = response.content.decode()
    assert "field-name" in html and "field-version" not in html and "Version:" not in html


def test_a_deactivated_person_is_not_offered_for_a_new_endpoint_or_token(
    personas: Personas,
) -> None:
    """The service refuses to vend or mint for them; the admin's add forms still listed them."""
    p = personas
    gone = p.other_owner
    gone.is_active = False
    gone.save(update_fields=["is_active"])
    client = _client(p.admin)
    for page, field in (("endpoint", "owner"), ("humantoken", "user")):
        html = client.get(f"/admin/queues/{page}/add/").content.decode()
        select = re.search(rf'<select name="{field}".*?</select>', html, re.S)
        assert select, page
        assert f'value="{p.owner.pk}"' in select.group(0), page
        assert f'value="{gone.pk}"' not in select.group(0), page
    # An endpoint they own still opens, its owner shown.
    endpoint, _ = services.endpoint_vend(
        actor=p.as_human(p.admin), owner=p.owner, name="Kept", queues=["inbox"]
    )
    Endpoint.objects.filter(pk=endpoint.pk).update(owner=gone)
    change = client.get(f"/admin/queues/endpoint/{endpoint.pk}/change/")
    assert change.status_code == 200
    assert re.search(rf'<option value="{gone.pk}" selected>', change.content.decode())
