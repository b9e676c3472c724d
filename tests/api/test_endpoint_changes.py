"""An endpoint's hook and settings from the operator API: a vend may set a hook URL (its signing
secret answered once), ``PATCH /api/v1/endpoints/{slug}`` changes what may change after vend
(only the fields sent; If-Match over its version, its ETag), and ``POST .../rotate-hook-secret``
makes a new secret, shown once. Before, only the admin and the shell could set a hook URL, and no
page or answer ever showed the secret, so no receiver could check a signature."""

from __future__ import annotations

from typing import Any

from queues.models import Endpoint
from switchboard.ledger.models import LedgerEntry, LedgerKind
from tests.api.conftest import Api
from tests.conftest import Personas

HOOK = "https://93.184.216.34/hooks/T01/s3cret?k=abc"


def _vend(api: Api, **extra: object) -> dict[str, Any]:
    response = api.post("/api/v1/endpoints", {"name": "Hooked", "queues": ["inbox"], **extra})
    assert response.status_code == 201, response.content
    return response.json()


def test_a_vend_with_a_hook_url_answers_its_secret_once_and_shows_only_where_hooks_go(
    owner_api: Api,
) -> None:
    body = _vend(owner_api, notify_url=HOOK)
    endpoint = Endpoint.objects.get(slug=body["endpoint"]["slug"])
    assert body["hook_secret"] == endpoint.notify_secret and body["hook_secret"].startswith(
        "whsec_"
    )
    assert body["endpoint"]["hook_url"] == "https://93.184.216.34/…"
    listing = owner_api.get("/api/v1/endpoints")
    [listed] = [e for e in listing.json()["endpoints"] if e["slug"] == endpoint.slug]
    assert listed["hook_url"] == "https://93.184.216.34/…"
    assert "s3cret" not in listing.content.decode() and "whsec_" not in listing.content.decode()
    assert _vend(owner_api, name="Plain")["hook_secret"] is None


def test_a_patch_changes_only_what_it_sends_over_the_version_read(
    personas: Personas, owner_api: Api
) -> None:
    slug = _vend(owner_api, rps=5)["endpoint"]["slug"]
    read = owner_api.get("/api/v1/endpoints").json()["endpoints"]
    version = next(e for e in read if e["slug"] == slug)["version"]
    changed = owner_api.patch(
        f"/api/v1/endpoints/{slug}", {"name": "Renamed", "burst": 7}, **{"If-Match": f'"{version}"'}
    )
    assert changed.status_code == 200, changed.content
    out = changed.json()["endpoint"]
    assert (out["name"], out["rate_limit_burst"], out["rate_limit_rps"]) == ("Renamed", 7, 5.0)
    assert changed["ETag"] == f'"{out["version"]}"' and out["version"] != version
    assert changed.json()["hook_secret"] is None
    [row] = LedgerEntry.objects.filter(kind=LedgerKind.ENDPOINT_UPDATE, scope=f"endpoint:{slug}")
    assert row.actor_human_name == "olive"
    # Over the version read before that change: refused, nothing written.
    stale = owner_api.patch(
        f"/api/v1/endpoints/{slug}", {"name": "Again"}, **{"If-Match": f'"{version}"'}
    )
    assert stale.status_code == 412 and stale.json()["code"] == "precondition_failed"
    assert "changed since it was read (last changed by olive at " in stale.json()["error"]
    assert Endpoint.objects.get(slug=slug).name == "Renamed"
    # null clears a setting back to the fleet's default.
    cleared = owner_api.patch(f"/api/v1/endpoints/{slug}", {"burst": None})
    assert cleared.status_code == 200 and cleared.json()["endpoint"]["rate_limit_burst"] is None


def test_a_patch_that_sets_a_hook_url_answers_the_new_secret_once(owner_api: Api) -> None:
    slug = _vend(owner_api)["endpoint"]["slug"]
    first = owner_api.patch(f"/api/v1/endpoints/{slug}", {"notify_url": HOOK}).json()
    assert first["hook_secret"] == Endpoint.objects.get(slug=slug).notify_secret
    again = owner_api.patch(f"/api/v1/endpoints/{slug}", {"notify_url": HOOK + "x"}).json()
    assert again["hook_secret"] is None  # the secret stays; only the URL moved
    gone = owner_api.patch(f"/api/v1/endpoints/{slug}", {"notify_url": None}).json()
    assert gone["endpoint"]["hook_url"] == "" and gone["hook_secret"] is None
    assert Endpoint.objects.get(slug=slug).notify_secret == ""


def test_a_patch_refuses_what_it_cannot_take_naming_the_field(
    owner_api: Api, other_api: Api, auditor_api: Api
) -> None:
    slug = _vend(owner_api)["endpoint"]["slug"]
    before = Endpoint.objects.get(slug=slug)
    for body, field in (
        ({"rps": "300"}, "rps"),
        ({"burst": 0}, "burst"),
        ({"name": None}, "name"),
        ({"name": ""}, "name"),
        ({"queues": ["more"]}, "queues"),
        ({"notify_url": "http://127.0.0.1:9/hook"}, "notify_url"),
        ({"notify_url": "http://user:pw@93.184.216.34/"}, "notify_url"),
    ):
        response = owner_api.patch(f"/api/v1/endpoints/{slug}", body)
        assert response.status_code == 400, (body, response.content)
        assert response.json()["field"].startswith(field), (body, response.json())
    bad_tag = owner_api.patch(f"/api/v1/endpoints/{slug}", {"name": "x"}, **{"If-Match": "v1"})
    assert bad_tag.status_code == 400 and bad_tag.json()["field"] == "If-Match"
    assert other_api.patch(f"/api/v1/endpoints/{slug}", {"name": "x"}).status_code == 404
    assert auditor_api.patch(f"/api/v1/endpoints/{slug}", {"name": "x"}).status_code == 403
    after = Endpoint.objects.get(slug=slug)
    assert (after.name, after.rate_limit_rps, after.notify_url) == (
        before.name,
        before.rate_limit_rps,
        before.notify_url,
    )


def test_rotating_a_hook_secret_answers_the_new_one_once(owner_api: Api) -> None:
    plain = _vend(owner_api, name="Plain")["endpoint"]["slug"]
    refused = owner_api.post(f"/api/v1/endpoints/{plain}/rotate-hook-secret", {})
    assert refused.status_code == 409 and "no hook URL" in refused.json()["error"]
    body = _vend(owner_api, notify_url=HOOK)
    slug, old = body["endpoint"]["slug"], body["hook_secret"]
    rotated = owner_api.post(f"/api/v1/endpoints/{slug}/rotate-hook-secret", {}).json()
    endpoint = Endpoint.objects.get(slug=slug)
    assert rotated["hook_secret"] == endpoint.notify_secret != old
    assert endpoint.notify_secret_previous == old and rotated["previous_secret_signs_until"]
    at_once = owner_api.post(
        f"/api/v1/endpoints/{slug}/rotate-hook-secret", {"overlap_seconds": 0}
    ).json()
    assert at_once["previous_secret_signs_until"] is None
    bad = owner_api.post(f"/api/v1/endpoints/{slug}/rotate-hook-secret", {"overlap_seconds": -1})
    assert bad.status_code == 400 and bad.json()["field"] == "overlap_seconds"
