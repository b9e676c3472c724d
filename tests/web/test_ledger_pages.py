"""The ledger list: visibility, filters in the URL, pagination, CSV export, the chain badge."""

from __future__ import annotations

import csv
import io
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from django.db import connection
from django.http import QueryDict

from admission import views as admission_views
from admission.models import AdmissionPolicy
from queues import pauses
from switchboard.ledger import tasks as ledger_tasks
from switchboard.ledger.models import LedgerCheck, LedgerEntry
from tests.conftest import Personas
from tests.web.conftest import budget, signed_in


@pytest.fixture(autouse=True)
def _only_the_tests_own_history(personas: Personas) -> None:
    """The list shows every row a reader may see. The personas' set-up (their endpoints, vended
    by system:fixture) is cleared, as on a fresh install, so each test reads its own history."""
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM admission_ledgerentry")
        cursor.execute("DELETE FROM admission_ledgerhead")


def _history(p: Personas) -> None:
    budget(p, max_in_flight=1)
    budget(p, max_in_flight=2)
    pauses.queue_pause(actor=p.as_human(p.admin), queue="inbox", reason="maint")
    pauses.queue_pause(actor=p.as_human(p.admin), queue="elsewhere", reason="x", create=True)
    from admission import services

    services.policy_set(
        actor=p.as_human(p.other_owner),
        endpoint=p.foreign,
        queue="inbox",
        max_in_flight=9,
        max_claims_per_window=None,
        window=None,
    )


def _csv(response: Any) -> list[dict[str, str]]:
    body = b"".join(response.streaming_content).decode()
    return list(csv.DictReader(io.StringIO(body)))


def test_auditors_read_every_row_and_owners_only_their_scopes_and_queues(
    personas: Personas,
) -> None:
    p = personas
    _history(p)
    auditor = signed_in(p.auditor).get("/ledger").content.decode()
    assert auditor.count('<tr>\n    <td class="num">') == 5
    owner_rows = _csv(signed_in(p.owner).get("/ledger.csv"))
    assert [(r["action"], r["scope"], r["queue"]) for r in owner_rows] == [
        ("queue.pause", "queue", "inbox"),
        ("policy.update", "endpoint:agent", "inbox"),
        ("policy.create", "endpoint:agent", "inbox"),
    ]
    other_rows = _csv(signed_in(p.other_owner).get("/ledger.csv"))
    assert {r["scope"] for r in other_rows} == {"endpoint:foreign", "queue"}
    # Its instants as every answer writes them (UTC, Z), not Python's +00:00.
    assert all(r["at"].endswith("Z") for r in owner_rows), owner_rows[0]["at"]


def test_filters_narrow_the_rows_and_the_export_alike(personas: Personas) -> None:
    p = personas
    _history(p)
    client = signed_in(p.auditor)
    cases: dict[str, list[str]] = {
        "scope=endpoint:agent": ["policy.update", "policy.create"],
        "queue=elsewhere": ["queue.pause"],
        "actor=ada": ["queue.pause", "queue.pause"],
        "actor=OTTO": ["policy.create"],
        "action=policy.update": ["policy.update"],
        "scope=queue&queue=inbox": ["queue.pause"],
    }
    for query, kinds in cases.items():
        assert [r["action"] for r in _csv(client.get(f"/ledger.csv?{query}"))] == kinds, query
        page = client.get(f"/ledger?{query}").content.decode()
        assert page.count('<span class="kind kind-') == len(kinds), query
        exported = QueryDict(query).urlencode().replace("&", "&amp;")
        assert f"/ledger.csv?{exported}" in page, query


def test_a_date_range_is_read_in_the_viewers_zone(personas: Personas) -> None:
    p = personas
    budget(p, max_in_flight=1)
    with connection.cursor() as cursor:
        # Not through the app: only the time is moved, and the chain badge is not under test.
        cursor.execute("UPDATE admission_ledgerentry SET at = '2026-03-10 03:30:00+00'")
    client = signed_in(p.auditor)
    client.cookies["tz"] = "America/New_York"  # 2026-03-09 23:30 there
    assert len(_csv(client.get("/ledger.csv?since=2026-03-09&until=2026-03-09"))) == 1
    assert len(_csv(client.get("/ledger.csv?since=2026-03-10"))) == 0
    client.cookies["tz"] = "UTC"
    assert len(_csv(client.get("/ledger.csv?since=2026-03-10&until=2026-03-10"))) == 1
    bad = client.get("/ledger?since=2026-03-10&until=2026-03-01")
    assert "the end of the range is before its start" in bad.content.decode()
    assert client.get("/ledger.csv?since=yesterday").status_code == 400
    # The date input's own spelling only: 03/10/2026 was read as 10 March (month first), and
    # other scripts' digits as ASCII ones.
    for spelled in ("03/10/2026", "03/10/26", "Mar 10 2026", "\u0662\u0660\u0662\u0666-03-10"):
        refused = client.get("/ledger", {"since": spelled}).content.decode()
        assert "Enter a date as YYYY-MM-DD." in refused, spelled
        assert '<span class="kind kind-' not in refused, spelled
        assert client.get("/ledger.csv", {"since": spelled}).status_code == 400, spelled
    # The first and last days a date field takes, in zones either side of UTC: the whole ledger,
    # where the day after the last one was a server error.
    for zone in ("Pacific/Kiritimati", "America/Los_Angeles"):
        client.cookies["tz"] = zone
        for query in ("until=9999-12-31", "since=0001-01-01&until=9999-12-31"):
            assert len(_csv(client.get(f"/ledger.csv?{query}"))) == 1, (zone, query)
            page = client.get(f"/ledger?{query}")
            assert page.content.decode().count('<span class="kind kind-') == 1, (zone, query)
        assert len(_csv(client.get("/ledger.csv?since=9999-12-31"))) == 0
        assert len(_csv(client.get("/ledger.csv?until=0001-01-01"))) == 0


def test_the_list_is_paginated_newest_first(personas: Personas, monkeypatch: Any) -> None:
    p = personas
    monkeypatch.setattr(admission_views, "LEDGER_PAGE", 2)
    _history(p)
    client = signed_in(p.auditor)
    first = client.get("/ledger?scope=endpoint:agent&page=1").content.decode()
    assert "Page 1 of 1" not in first
    page1 = client.get("/ledger").content.decode()
    assert "Page 1 of 3 · 5 rows" in page1 and "page=2" in page1
    page3 = client.get("/ledger?page=3").content.decode()
    assert page3.count('<span class="kind kind-') == 1 and "policy.create" in page3


def test_the_csv_has_readable_changes_and_the_raw_before_and_after(personas: Personas) -> None:
    p = personas
    budget(p, max_in_flight=1)
    budget(p, max_in_flight=2)
    response = signed_in(p.auditor).get("/ledger.csv")
    assert response["Content-Type"].startswith("text/csv")
    assert response["Content-Disposition"].startswith('attachment; filename="ledger-')
    update, create = _csv(response)
    assert update["changes"] == "max_in_flight: 1 → 2"
    assert '"max_in_flight": 1' in update["before"] and '"max_in_flight": 2' in update["after"]
    assert create["actor_human"] == "olive" and len(create["entry_hash"]) == 64


def test_the_chain_badge_shows_the_stored_check_and_verify_now_refreshes_it(
    personas: Personas,
) -> None:
    p = personas
    budget(p, max_in_flight=1)
    budget(p, max_in_flight=2)
    rows = LedgerEntry.objects.count()
    assert f"Chain verified · {rows} rows" in signed_in(p.auditor).get("/ledger").content.decode()
    with connection.cursor() as cursor:
        cursor.execute(
            """UPDATE admission_ledgerentry SET after = jsonb_set(after, '{max_in_flight}', '99') WHERE kind = 'policy.create'"""
        )
    # A page view reads the stored check; it does not read the whole chain again.
    stale = signed_in(p.auditor).get("/ledger").content.decode()
    assert "Chain verified" in stale
    response = signed_in(p.owner).post("/ledger/verify")
    assert response.status_code == 302
    broken = signed_in(p.auditor).get("/ledger").content.decode()
    assert "Chain broken" in broken and ": mutated" in broken
    owner_view = signed_in(p.owner).get("/ledger").content.decode()
    assert "Chain broken" in owner_view and ": mutated" not in owner_view
    assert LedgerEntry.objects.count() == rows


def test_the_beat_task_stores_a_fresh_check(personas: Personas) -> None:
    budget(personas, max_in_flight=1)
    assert ledger_tasks.verify() is True
    stored = LedgerCheck.objects.get()
    assert stored.ok and stored.report["rows"] == LedgerEntry.objects.count()


def test_the_chain_badge_is_in_the_viewers_zone_and_counts_rows_only_for_readers_of_all(
    personas: Personas,
) -> None:
    # The badge said "checked 2026-12-05 07:15:14" (UTC, unnamed) on a page of times in the
    # viewer's zone, and showed an owner the whole ledger's row count beside their own rows.
    p = personas
    budget(p, max_in_flight=1)
    ledger_tasks.verify()
    checked = LedgerCheck.objects.get().checked_at
    rows = LedgerEntry.objects.count()
    zone = "America/New_York"
    when = checked.astimezone(ZoneInfo(zone)).strftime("%Y-%m-%d %H:%M:%S %Z")

    def ledger_page(user: Any) -> str:
        client = signed_in(user)
        client.cookies["tz"] = zone
        return client.get("/ledger").content.decode()

    for reader in (p.auditor, p.admin):
        html = ledger_page(reader)
        assert f"checked {when}" in html
        assert f"Chain verified · {rows} row" in html
    html = ledger_page(p.owner)
    assert f"checked {when}" in html
    badge = html[html.index('class="chain-badge') :].split("</p>", 1)[0]
    assert "Chain verified" in badge and " row" not in badge


def test_an_invalid_filter_names_the_fields_by_their_labels_and_offers_no_export(
    personas: Personas,
) -> None:
    client = signed_in(personas.auditor)
    html = client.get("/ledger?since=2026-12-05&until=2026-12-01").content.decode()
    error = html[html.index('<p class="error" role="alert">') :].split("</p>", 1)[0]
    assert "To: the end of the range is before its start" in error
    assert "until:" not in error
    assert "Export CSV" not in html
    html = client.get("/ledger?since=yesterday").content.decode()
    assert "From: Enter a date as YYYY-MM-DD." in html and "since:" not in html
    assert "Export CSV" not in html
    assert "Export CSV" in client.get("/ledger?since=2026-12-01").content.decode()


def test_an_export_with_a_refused_filter_is_the_ledger_page_naming_it(personas: Personas) -> None:
    """A crafted or stale export link: the page saying which filter is wrong, not a text file."""
    response = signed_in(personas.auditor).get("/ledger.csv?since=yesterday&kind=pause")
    assert response.status_code == 400
    assert response["Content-Type"].startswith("text/html")
    assert "Content-Disposition" not in response
    html = response.content.decode()
    error = html[html.index('<p class="error" role="alert">') :].split("</p>", 1)[0]
    assert "From: Enter a date as YYYY-MM-DD." in error
    assert "Export CSV" not in html


def test_an_owner_hears_of_their_own_budgets_drift_not_the_fleets(personas: Personas) -> None:
    """The badge showed an owner the fleet's count of drifted budgets."""
    from admission import services as admission_services

    p = personas
    theirs = admission_services.policy_set(
        actor=p.as_human(p.admin),
        endpoint=p.foreign,
        queue="inbox",
        max_in_flight=1,
        max_claims_per_window=None,
        window=None,
    )
    mine = budget(p, max_in_flight=1)
    drifted = AdmissionPolicy.objects.filter(pk=theirs.pk)
    drifted.update(max_in_flight=7)  # behind the ledger's back
    ledger_tasks.verify()

    def badge(user: Any) -> str:
        html = signed_in(user).get("/ledger").content.decode()
        return html[html.index('class="chain-badge') :].split("</p>", 1)[0]

    assert "Chain intact · 1 policy drifted" in badge(p.auditor)
    assert "Chain verified" in badge(p.owner) and "drifted" not in badge(p.owner)
    AdmissionPolicy.objects.filter(pk=mine.pk).update(max_in_flight=9)
    ledger_tasks.verify()
    assert "Chain intact · 2 policies drifted" in badge(p.auditor)
    assert "Chain intact · 1 policy drifted" in badge(p.owner)


def test_verify_now_is_rationed_per_person(personas: Personas, settings: Any) -> None:
    """Each verify reads every ledger row: any signed-in person could keep the web process at
    it. A burst of two, then one each 30 s; a refusal says when, and reads nothing."""
    settings.LEDGER_VERIFY_RATE_LIMIT = (1 / 30, 2)
    client = signed_in(personas.owner)
    for _ in range(2):
        assert client.post("/ledger/verify").status_code == 302
    checked = list(LedgerCheck.objects.values_list("pk", "checked_at"))
    refused = client.post("/ledger/verify", follow=True).content.decode()
    assert "verify again in" in refused
    assert list(LedgerCheck.objects.values_list("pk", "checked_at")) == checked
    # Another person has their own ration.
    assert signed_in(personas.auditor).post("/ledger/verify").status_code == 302
    assert list(LedgerCheck.objects.values_list("pk", "checked_at")) != checked


def test_verify_now_comes_back_to_the_rows_being_read(personas: Personas) -> None:
    # It came back to the unfiltered ledger.
    client = signed_in(personas.auditor)
    page = client.get("/ledger?action=todo.release").content.decode()
    assert 'name="query" value="action=todo.release"' in page
    response = client.post("/ledger/verify", {"query": "action=todo.release"})
    assert response.status_code == 302 and response["Location"] == "/ledger?action=todo.release"
    crafted = client.post("/ledger/verify", {"query": "x=1\r\nSet-Cookie: a=b"})
    assert crafted["Location"] == "/ledger?x=1%0D%0ASet-Cookie%3A+a%3Db"
