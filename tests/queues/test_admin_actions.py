"""The admin's list actions (revoke, retry, release, resume): offered only to those who may take
them, and each one's answer counts what was done, every refusal a warning of its own."""

from __future__ import annotations

import re
from typing import Any

from django.contrib.auth.models import Permission, User
from django.test import Client

from queues import pauses, services
from queues.models import Endpoint, EndpointState, HumanToken, QueuePause, TodoState
from tests.conftest import Personas, audit_rows, push

LISTS = {
    "/admin/queues/endpoint/": ["revoke", "rotate_hook_secret"],
    "/admin/queues/todo/": ["retry", "release"],
    "/admin/queues/queuepause/": ["resume"],
    "/admin/queues/humantoken/": ["revoke"],
}


def _client(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _offered(client: Client, url: str) -> list[str]:
    """The actions the list's action menu offers (none: no menu at all)."""
    html = client.get(url).content.decode()
    menu = re.search(r'<select name="action"[^>]*>(.*?)</select>', html, re.S)
    return re.findall(r'<option value="(\w+)"', menu.group(1)) if menu else []


def _act(client: Client, url: str, action: str, *selected: Any) -> list[tuple[str, str]]:
    """Post an action on the selection, confirmed where the action asks first (``post=yes``,
    as Django's delete); the messages the list then shows, (level, text)."""
    response = client.post(
        url,
        {"action": action, "_selected_action": [str(s) for s in selected], "post": "yes"},
        follow=True,
    )
    assert response.status_code == 200
    return [(m.level_tag, str(m)) for m in response.context["messages"]]


def _staff(name: str, *codenames: str) -> User:
    user = User.objects.create_user(name, password=f"pw-{name}-123", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
    return user


def _world(p: Personas) -> dict[str, Any]:
    """Something for every action: a claimed and a failed todo, a paused queue, a token."""
    claimed, failed = push(p, 2)
    services.claim(actor=p.as_agent(), todo_id=claimed.id)
    services.claim(actor=p.as_agent(), todo_id=failed.id)
    services.fail(actor=p.as_agent(), todo_id=failed.id)
    pauses.queue_pause(actor=p.as_human(p.admin), queue="inbox", reason="upgrade")
    token, _ = services.human_token_create(user=p.owner, name="t", actor=p.as_human(p.owner))
    return {"claimed": claimed, "failed": failed, "token": token}


def test_an_auditor_is_offered_no_action_and_a_posted_one_does_nothing(
    personas: Personas,
) -> None:
    # An auditor (staff, in the auditors group: view permissions only) was offered Revoke, Retry,
    # Release and Resume; posting Revoke was refused by the service, and the list still said
    # "Revoked; 0 live todo(s) dead-lettered."
    p = personas
    world = _world(p)
    p.auditor.is_staff = True
    p.auditor.save()
    # Even holding the change permissions (and the tokens' view), an auditor changes nothing.
    p.auditor.user_permissions.add(
        *Permission.objects.filter(
            codename__in=[
                "change_endpoint",
                "change_todo",
                "pause_queue",
                "view_humantoken",
                "change_humantoken",
            ]
        )
    )
    client = _client(p.auditor)
    for url in LISTS:
        assert _offered(client, url) == [], url
    rows = audit_rows().count()
    for url, action, selected in (
        ("/admin/queues/endpoint/", "revoke", p.agent.pk),
        ("/admin/queues/todo/", "release", world["claimed"].pk),
        ("/admin/queues/todo/", "retry", world["failed"].pk),
        ("/admin/queues/queuepause/", "resume", "inbox"),
        ("/admin/queues/humantoken/", "revoke", world["token"].pk),
    ):
        shown = _act(client, url, action, selected)
        assert not any(re.search(r"revoked|retried|released|resumed", t) for _, t in shown), (
            url,
            shown,
        )
    p.agent.refresh_from_db()
    world["claimed"].refresh_from_db()
    world["failed"].refresh_from_db()
    world["token"].refresh_from_db()
    assert p.agent.state == EndpointState.ACTIVE
    assert world["claimed"].state == TodoState.CLAIMED
    assert world["failed"].state == TodoState.FAILED
    assert QueuePause.objects.filter(queue="inbox").exists()
    assert world["token"].revoked_at is None
    assert audit_rows().count() == rows


def test_the_actions_are_offered_to_those_holding_the_permission_to_take_them(
    personas: Personas,
) -> None:
    p = personas
    _world(p)
    p.owner.is_staff = True
    p.owner.save()
    views = ["view_endpoint", "view_todo", "view_queuepause", "view_humantoken"]
    p.owner.user_permissions.add(*Permission.objects.filter(codename__in=views))
    for url in LISTS:  # their own endpoints, todos and token listed, and no action offered
        assert _offered(_client(p.owner), url) == [], url
    changes = ["change_endpoint", "change_todo", "pause_queue", "change_humantoken"]
    p.owner.user_permissions.add(*Permission.objects.filter(codename__in=changes))
    for client in (_client(p.owner), _client(p.admin)):
        for url, actions in LISTS.items():
            assert _offered(client, url) == actions, url


def test_another_owners_endpoint_is_not_revoked_and_the_list_says_nothing_was_done(
    personas: Personas,
) -> None:
    # A staff owner posting another owner's endpoint id was told "Revoked; 0 …".
    p = personas
    p.owner.is_staff = True
    p.owner.save()
    p.owner.user_permissions.add(
        *Permission.objects.filter(codename__in=["view_endpoint", "change_endpoint"])
    )
    client = _client(p.owner)
    rows = audit_rows().count()
    shown = _act(client, "/admin/queues/endpoint/", "revoke", p.foreign.pk)
    assert shown == [("warning", "Nothing done: the selection names no such item.")]
    p.foreign.refresh_from_db()
    assert p.foreign.state == EndpointState.ACTIVE and audit_rows().count() == rows
    # Their own, with the other's id beside it: only their own is revoked, and counted.
    shown = _act(client, "/admin/queues/endpoint/", "revoke", p.agent2.pk, p.foreign.pk)
    assert shown == [("info", "1 endpoint(s) revoked; 0 live todo(s) dead-lettered.")]
    p.foreign.refresh_from_db()
    assert p.foreign.state == EndpointState.ACTIVE
    assert Endpoint.objects.get(pk=p.agent2.pk).state == EndpointState.REVOKED


def test_each_summary_counts_what_was_done_and_warns_of_each_item_left_alone(
    personas: Personas,
) -> None:
    p = personas
    world = _world(p)
    client = _client(p.admin)
    services.endpoint_revoke(endpoint=p.agent2, actor=p.as_human(p.admin))
    shown = _act(client, "/admin/queues/endpoint/", "revoke", p.agent2.pk)
    assert shown == [
        ("info", "0 endpoint(s) revoked."),
        ("warning", f"Left alone: {p.agent2.slug}: already revoked"),
    ]
    # A pending todo is not retried, and the service says why.
    (pending,) = push(p, 1, queue="outbox")
    shown = _act(client, "/admin/queues/todo/", "retry", world["failed"].pk, pending.pk)
    assert shown[0] == ("info", "1 todo(s) retried.")
    assert shown[1:] == [
        (
            "warning",
            "Left alone: \u2068todo 0\u2069: todo is pending; only a failed todo can be retried",
        )
    ]
    shown = _act(client, "/admin/queues/queuepause/", "resume", "inbox")
    assert shown == [("info", "1 queue(s) resumed: inbox.")]
    services.human_token_revoke(token=world["token"], actor=p.as_human(p.owner))
    shown = _act(client, "/admin/queues/humantoken/", "revoke", world["token"].pk)
    assert shown == [
        ("info", "0 token(s) revoked."),
        ("warning", f"Left alone: {world['token']}: already revoked"),
    ]
    # As shown: the admin capitalises a message's first letter, which misspelt the prefix.
    page = client.post(
        "/admin/queues/humantoken/",
        {"action": "revoke", "_selected_action": [str(world["token"].pk)]},
        follow=True,
    ).content.decode()
    assert f"Left alone: {world['token']}" in page
    assert HumanToken.objects.get().revoked_at is not None


def test_a_revoke_asks_first_naming_what_each_endpoint_would_lose(personas: Personas) -> None:
    # The action revoked at once: one slip of the action menu dead-lettered an agent's work.
    p = personas
    live = push(p, 3)
    services.claim(actor=p.as_agent(), todo_id=live[0].id)
    services.endpoint_revoke(endpoint=p.agent2, actor=p.as_human(p.admin))
    rows = audit_rows().count()
    client = _client(p.admin)
    selected = [str(p.agent.pk), str(p.agent2.pk)]
    asked = client.post(
        "/admin/queues/endpoint/", {"action": "revoke", "_selected_action": selected}
    )
    assert asked.status_code == 200
    html = asked.content.decode()
    assert "Revoke these endpoints?" in html
    cells = re.findall(r"<tr><td>(.*?)</td><td>(.*?)</td><td>(.*?)</td></tr>", html)
    assert cells == [(f"{p.agent.name} ({p.agent.slug})", p.agent.owner.username, "3")]
    assert f"Left alone (already revoked): {p.agent2.slug}." in html
    assert sorted(re.findall(r'name="_selected_action" value="([^"]+)"', html)) == sorted(selected)
    assert 'name="post" value="yes"' in html
    # Asking changed nothing.
    assert Endpoint.objects.get(pk=p.agent.pk).state == EndpointState.ACTIVE
    assert audit_rows().count() == rows

    done = client.post(
        "/admin/queues/endpoint/",
        {"action": "revoke", "_selected_action": selected, "post": "yes"},
        follow=True,
    )
    shown = [(m.level_tag, str(m)) for m in done.context["messages"]]
    assert shown == [
        ("info", "1 endpoint(s) revoked; 3 live todo(s) dead-lettered."),
        ("warning", f"Left alone: {p.agent2.slug}: already revoked"),
    ]
    assert Endpoint.objects.get(pk=p.agent.pk).state == EndpointState.REVOKED


def test_a_revoke_of_nothing_active_does_not_ask(personas: Personas) -> None:
    p = personas
    services.endpoint_revoke(endpoint=p.agent2, actor=p.as_human(p.admin))
    response = _client(p.admin).post(
        "/admin/queues/endpoint/",
        {"action": "revoke", "_selected_action": [str(p.agent2.pk)]},
        follow=True,
    )
    assert [(m.level_tag, str(m)) for m in response.context["messages"]] == [
        ("info", "0 endpoint(s) revoked."),
        ("warning", f"Left alone: {p.agent2.slug}: already revoked"),
    ]


def test_releasing_a_todo_that_is_not_claimed_says_its_state(personas: Personas) -> None:
    # A revoked endpoint's dead letters were "Left alone: …: no such todo", though the list
    # the action ran from showed them.
    p = personas
    [todo] = push(p, 1, endpoint=p.agent2)
    services.endpoint_revoke(endpoint=p.agent2, actor=p.as_human(p.admin))
    shown = _act(_client(p.admin), "/admin/queues/todo/", "release", todo.pk)
    assert shown == [
        ("info", "0 todo(s) released."),
        ("warning", f"Left alone: \u2068{todo.title}\u2069: todo is failed, not claimed"),
    ]
