"""Regression: an endpoint given a hook URL after it was vended signs its hooks with a real key.

Before ``endpoint_update`` existed, the admin's change form saved ``notify_url`` directly, so such
an endpoint had an empty secret and every ready hook was signed with an empty key (anyone could
forge one). The hook is really POSTed to a local server by the real Celery task, run eagerly.
"""

from __future__ import annotations

from typing import Any

from django.test import Client

from queues import hooks, services
from queues.models import Endpoint
from tests.conftest import FIXTURE, Personas, push
from tests.pause.conftest import HookServer


def _signatures(secret: str, post: dict[str, object]) -> tuple[str, list[str]]:
    """The signature ``secret`` makes of the post, and the signatures the post carried."""
    headers = {k.lower(): v for k, v in post["headers"].items()}  # type: ignore[attr-defined]
    expected = hooks.sign(
        secret,
        headers["webhook-id"],
        int(headers["webhook-timestamp"]),
        str(post["body"]).encode(),
    )
    return expected, headers["webhook-signature"].split(" ")


def _signed_with(secret: str, post: dict[str, object]) -> bool:
    """Signed with ``secret`` alone."""
    expected, carried = _signatures(secret, post)
    return carried == [expected]


def _signed_with_any(secret: str, post: dict[str, object]) -> bool:
    """``secret``'s signature among those carried (a rotation's overlap carries two)."""
    expected, carried = _signatures(secret, post)
    return expected in carried


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
        follow=True,
    )
    assert response.redirect_chain, response.content.decode()[:2000]

    endpoint = Endpoint.objects.get(pk=endpoint.pk)
    assert endpoint.notify_url == hook_server.url
    assert endpoint.notify_secret.startswith("whsec_")
    # The page said the secret once (no page showed it, so no receiver could check a hook).
    [shown] = _secrets_shown(response)
    push(p, 1, queue="inbox", endpoint=endpoint)
    assert _signed_with(shown, hook_server.posts[0])
    # A later save that keeps the URL makes no new secret and says none.
    again = client.post(
        f"/admin/queues/endpoint/{endpoint.pk}/change/",
        {"name": "Admin hook renamed", "owner": p.owner.pk, "notify_url": hook_server.url},
        follow=True,
    )
    assert again.redirect_chain and _secrets_shown(again) == []


def _secrets_shown(response: Any) -> list[str]:
    return [
        m.split("shown only now: ")[1].split(" ")[0]
        for m in map(str, response.context["messages"])
        if "hook signing secret" in m
    ]


def test_the_admin_vend_with_a_hook_url_shows_its_secret_once(
    tx_personas: Personas, hook_server: HookServer, eager_celery: None
) -> None:
    p = tx_personas
    client = Client()
    client.force_login(p.admin)
    response = client.post(
        "/admin/queues/endpoint/add/",
        {
            "name": "Vended hook",
            "owner": p.owner.pk,
            "queues": "inbox",
            "verbs": ["claim", "complete"],
            "notify_url": hook_server.url,
        },
        follow=True,
    )
    [shown] = _secrets_shown(response)
    endpoint = Endpoint.objects.get(name="Vended hook")
    assert shown == endpoint.notify_secret
    push(p, 1, queue="inbox", endpoint=endpoint)
    assert _signed_with(shown, hook_server.posts[0])


def test_the_admin_rotates_hook_secrets_and_shows_each_once(
    tx_personas: Personas, hook_server: HookServer, eager_celery: None
) -> None:
    p = tx_personas
    hooked, _ = services.endpoint_vend(
        actor=FIXTURE,
        owner=p.owner,
        name="Hooked",
        queues=["inbox"],
        rps=0,
        notify_url=hook_server.url,
    )
    old = hooked.notify_secret
    client = Client()
    client.force_login(p.admin)
    response = client.post(
        "/admin/queues/endpoint/",
        {
            "action": "rotate_hook_secret",
            "_selected_action": [str(hooked.pk), str(p.agent.pk)],
        },
        follow=True,
    )
    shown = [(m.level_tag, str(m)) for m in response.context["messages"]]
    assert shown[:2] == [
        ("info", "1 hook secret(s) rotated."),
        (
            "warning",
            f"Left alone: {p.agent.slug}: the endpoint has no hook URL, so no hook secret to "
            "rotate",
        ),
    ]
    [new] = _secrets_shown(response)
    assert new != old and "the previous one also signs until" in shown[2][1]
    push(p, 1, queue="inbox", endpoint=hooked)
    # Both sign during the overlap: a receiver still on the old secret verifies too.
    assert _signed_with_any(new, hook_server.posts[0])
    assert _signed_with_any(old, hook_server.posts[0])


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
