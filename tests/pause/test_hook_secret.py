"""Regression: an endpoint given a hook URL after it was vended signs its hooks with a real key.

Before ``endpoint_update`` existed, the admin's change form saved ``notify_url`` directly, so such
an endpoint had an empty secret and every ready hook was signed with an empty key (anyone could
forge one). The hook is really POSTed to a local server by the real Celery task, run eagerly.
"""

from __future__ import annotations

from django.test import Client

from queues import hooks, services
from queues.models import Endpoint
from tests.conftest import FIXTURE, Personas, push
from tests.pause.conftest import HookServer


def _signed_with(secret: str, post: dict[str, object]) -> bool:
    headers = {k.lower(): v for k, v in post["headers"].items()}  # type: ignore[attr-defined]
    expected = hooks.sign(
        secret,
        headers["webhook-id"],
        int(headers["webhook-timestamp"]),
        str(post["body"]).encode(),
    )
    return bool(headers["webhook-signature"] == expected)


def test_a_hook_url_set_after_vend_signs_with_a_non_empty_secret(
    tx_personas: Personas, hook_server: HookServer, eager_celery: None
) -> None:
    p = tx_personas
    endpoint, _ = services.endpoint_vend(
        actor=FIXTURE, owner=p.owner, name="Late hook", queues=["inbox"], rps=0
    )
    assert endpoint.notify_secret == ""

    services.endpoint_update(
        endpoint=endpoint, actor=p.as_human(p.owner), notify_url=hook_server.url
    )

    endpoint.refresh_from_db()
    assert endpoint.notify_secret.startswith("whsec_") and len(endpoint.notify_secret) > 20
    push(p, 1, queue="inbox", endpoint=endpoint)
    assert len(hook_server.posts) == 1
    assert _signed_with(endpoint.notify_secret, hook_server.posts[0])
    assert not _signed_with("", hook_server.posts[0])


def test_the_admins_change_form_gives_a_new_hook_url_its_secret(
    tx_personas: Personas, hook_server: HookServer, eager_celery: None
) -> None:
    p = tx_personas
    endpoint, _ = services.endpoint_vend(
        actor=FIXTURE, owner=p.owner, name="Admin hook", queues=["inbox"], rps=0
    )
    client = Client()
    client.force_login(p.admin)
    response = client.post(
        f"/admin/queues/endpoint/{endpoint.pk}/change/",
        {"name": "Admin hook", "owner": p.owner.pk, "notify_url": hook_server.url},
    )
    assert response.status_code == 302, response.content.decode()[:2000]

    endpoint = Endpoint.objects.get(pk=endpoint.pk)
    assert endpoint.notify_url == hook_server.url
    assert endpoint.notify_secret.startswith("whsec_")
    push(p, 1, queue="inbox", endpoint=endpoint)
    assert _signed_with(endpoint.notify_secret, hook_server.posts[0])


def test_clearing_the_hook_url_clears_its_secret(
    tx_personas: Personas, hook_server: HookServer
) -> None:
    p = tx_personas
    endpoint, _ = services.endpoint_vend(
        actor=FIXTURE,
        owner=p.owner,
        name="Hooked",
        queues=["inbox"],
        rps=0,
        notify_url=hook_server.url,
    )
    services.endpoint_update(endpoint=endpoint, actor=p.as_human(p.owner), notify_url="")
    endpoint.refresh_from_db()
    assert (endpoint.notify_url, endpoint.notify_secret) == ("", "")
