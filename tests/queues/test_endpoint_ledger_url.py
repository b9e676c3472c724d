"""A hook URL may carry its receiver's secret (a token in the path or the query). The ledger,
append-only and read by auditors, kept it verbatim; it now keeps where hooks go (scheme, host and
port) and a keyed digest of the whole URL, so every change still shows and nothing secret stays."""

from __future__ import annotations

import json

from django.test import Client

from queues import services
from queues.models import Endpoint
from switchboard.ledger import chain
from switchboard.ledger.models import LedgerEntry, LedgerKind
from tests.conftest import FIXTURE, Personas

SECRET_URL = "https://93.184.216.34/hooks/T0001/s3cr3t-path?k=supersecret"


def _rows(slug: str) -> list[LedgerEntry]:
    return list(LedgerEntry.objects.filter(scope=f"endpoint:{slug}").order_by("seq"))


def test_the_ledger_keeps_a_hook_urls_origin_and_digest_not_its_secrets(
    personas: Personas,
) -> None:
    p = personas
    endpoint, _ = services.endpoint_vend(
        actor=FIXTURE, owner=p.owner, name="Hooked", queues=["inbox"], notify_url=SECRET_URL
    )
    # Only the query changes: still a change the ledger records.
    services.endpoint_update(
        endpoint=endpoint,
        actor=p.as_human(p.owner),
        notify_url=SECRET_URL.replace("supersecret", "rotated"),
    )
    services.endpoint_update(endpoint=endpoint, actor=p.as_human(p.owner), notify_url="")
    vend, changed, cleared = _rows(endpoint.slug)
    assert vend.kind == LedgerKind.ENDPOINT_VEND
    assert [changed.kind, cleared.kind] == [LedgerKind.ENDPOINT_UPDATE] * 2
    assert vend.after["notify_url"] == "https://93.184.216.34/…"  # type: ignore[index]
    digests = [vend.after["notify_url_digest"], changed.after["notify_url_digest"]]  # type: ignore[index]
    assert len(set(digests)) == 2 and all(len(d) == 16 for d in digests)
    assert cleared.after["notify_url"] == "" and "notify_url_digest" not in cleared.after  # type: ignore[index, operator]
    text = json.dumps([[r.before, r.after] for r in (vend, changed, cleared)])
    for secret in ("s3cr3t", "supersecret", "rotated", "T0001"):
        assert secret not in text
    assert chain.verify().ok


def test_the_auditors_ledger_page_and_csv_show_no_part_of_the_secret(personas: Personas) -> None:
    p = personas
    services.endpoint_vend(
        actor=FIXTURE, owner=p.owner, name="Hooked", queues=["inbox"], notify_url=SECRET_URL
    )
    client = Client()
    client.force_login(p.auditor)
    for url in ("/ledger", "/ledger.csv"):
        response = client.get(url)
        body = b"".join(response.streaming_content) if response.streaming else response.content  # type: ignore[attr-defined]
        assert response.status_code == 200 and b"93.184.216.34" in body, url
        assert b"supersecret" not in body and b"s3cr3t" not in body, url


def test_a_bare_origin_is_kept_whole(personas: Personas) -> None:
    endpoint, _ = services.endpoint_vend(
        actor=FIXTURE,
        owner=personas.owner,
        name="Plain",
        queues=["inbox"],
        notify_url="https://93.184.216.34",
    )
    [vend] = _rows(endpoint.slug)
    assert vend.after["notify_url"] == "https://93.184.216.34/"  # type: ignore[index]


def test_the_admin_shows_a_reader_only_where_hooks_go(personas: Personas) -> None:
    # The read-only change page showed an auditor the whole URL, its ?k= secret included.
    p = personas
    endpoint, _ = services.endpoint_vend(
        actor=FIXTURE, owner=p.owner, name="Hooked", queues=["inbox"], notify_url=SECRET_URL
    )
    p.auditor.is_staff = True
    p.auditor.save()
    reader = Client()
    reader.force_login(p.auditor)
    page = reader.get(f"/admin/queues/endpoint/{endpoint.pk}/change/").content.decode()
    assert "https://93.184.216.34/…" in page
    assert "supersecret" not in page and "s3cr3t" not in page
    writer = Client()
    writer.force_login(p.admin)  # who may change it sees the URL to change
    assert (
        SECRET_URL.replace("&", "&amp;")
        in writer.get(f"/admin/queues/endpoint/{endpoint.pk}/change/").content.decode()
    )


def test_a_secret_said_once_never_travels_in_a_cookie(personas: Personas) -> None:
    # Messages were Django's cookie-first storage: a vended token and a hook secret went to
    # the browser in Set-Cookie and back in every request's Cookie header.
    client = Client()
    client.force_login(personas.admin)
    response = client.post(
        "/admin/queues/endpoint/add/",
        {
            "name": "Cookie check",
            "owner": personas.owner.pk,
            "queues": "inbox",
            "verbs": ["claim", "complete"],
            "notify_url": SECRET_URL,
        },
    )
    assert response.status_code == 302
    endpoint = Endpoint.objects.get(name="Cookie check")
    # No messages cookie at all (its value is signed and compressed: a secret in it would not
    # show as text, so the absence is what to check).
    assert not (response.cookies.get("messages") and response.cookies["messages"].value)
    page = client.get(response["Location"]).content.decode()
    assert endpoint.notify_secret in page  # said once, on the page
