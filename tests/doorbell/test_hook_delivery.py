"""Ready hooks: secret rotation with an overlap in which old and new both verify, and delivery
with at most three attempts five seconds apart, after which the endpoint shows the failure."""

from __future__ import annotations

import itertools
import json
import time
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.test import Client
from django.utils import timezone
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from queues import services
from queues.access import HumanActor
from queues.hook_tasks import deliver_ready_hook
from queues.models import Endpoint
from queues.schemas import endpoint_out
from switchboard.core import counters
from switchboard.core.errors import Conflict, Forbidden, InvalidArgument
from switchboard.ledger.models import LedgerEntry, LedgerKind
from tests.conftest import Personas, push
from tests.doorbell.streams import wait_for
from tests.pause.conftest import HookServer


def verifies(secret: str, post: dict[str, Any]) -> bool:
    """The receiver's check, with the reference Standard Webhooks library."""
    try:
        Webhook(secret).verify(post["body"], post["headers"])
    except WebhookVerificationError:
        return False
    return True


def _hooked(p: Personas, hook_server: HookServer) -> Endpoint:
    return services.endpoint_update(
        endpoint=p.agent, actor=p.as_human(p.owner), notify_url=hook_server.url
    )


def test_after_a_rotation_hooks_verify_with_the_old_and_the_new_secret_until_the_overlap_ends(
    tx_personas: Personas, hook_server: HookServer, eager_celery: None
) -> None:
    p = tx_personas
    endpoint = _hooked(p, hook_server)
    old = endpoint.notify_secret
    new = services.endpoint_rotate_hook_secret(
        endpoint=endpoint, actor=p.as_human(p.owner), overlap_seconds=3600
    )
    assert new != old and new.startswith("whsec_")
    push(p, 1)
    (during,) = hook_server.posts
    assert verifies(old, during) and verifies(new, during)

    Endpoint.objects.filter(pk=endpoint.pk).update(
        notify_secret_previous_until=timezone.now() - timedelta(seconds=1)
    )
    push(p, 1)
    after = hook_server.posts[1]
    assert verifies(new, after) and not verifies(old, after)


def test_a_rotation_without_overlap_drops_the_old_secret_at_once(
    tx_personas: Personas, hook_server: HookServer, eager_celery: None
) -> None:
    p = tx_personas
    old = _hooked(p, hook_server).notify_secret
    new = services.endpoint_rotate_hook_secret(
        endpoint=p.agent, actor=p.as_human(p.owner), overlap_seconds=0
    )
    push(p, 1)
    (post,) = hook_server.posts
    assert verifies(new, post) and not verifies(old, post)


def test_a_rotation_is_in_the_ledger_without_either_secret(
    tx_personas: Personas, hook_server: HookServer
) -> None:
    p = tx_personas
    old = _hooked(p, hook_server).notify_secret
    new = services.endpoint_rotate_hook_secret(endpoint=p.agent, actor=p.as_human(p.owner))
    entry = LedgerEntry.objects.get(kind=LedgerKind.ENDPOINT_HOOK_SECRET_ROTATE)
    assert entry.actor_human_name == p.owner.get_username()
    assert entry.scope == f"endpoint:{p.agent.slug}"
    assert entry.after is not None
    assert entry.after["previous_secret_signs_until"] is not None
    assert old not in str(entry.before) + str(entry.after)
    assert new not in str(entry.before) + str(entry.after)


def test_only_the_owner_rotates_and_only_a_hook_that_exists(
    tx_personas: Personas, hook_server: HookServer
) -> None:
    p = tx_personas
    with pytest.raises(Conflict, match="no hook URL"):
        services.endpoint_rotate_hook_secret(endpoint=p.agent, actor=p.as_human(p.owner))
    secret = _hooked(p, hook_server).notify_secret
    for stranger in (p.other_owner, p.auditor):
        with pytest.raises(Forbidden):
            services.endpoint_rotate_hook_secret(endpoint=p.agent, actor=HumanActor(stranger))
    with pytest.raises(InvalidArgument) as refused:
        services.endpoint_rotate_hook_secret(
            endpoint=p.agent, actor=p.as_human(p.owner), overlap_seconds=-1
        )
    assert refused.value.field == "overlap_seconds"
    p.agent.refresh_from_db()
    assert p.agent.notify_secret == secret
    assert not LedgerEntry.objects.filter(kind=LedgerKind.ENDPOINT_HOOK_SECRET_ROTATE).exists()


def test_a_failing_receiver_gets_three_attempts_five_seconds_apart_then_the_endpoint_shows_it(
    tx_personas: Personas, hook_server: HookServer, celery_worker: Any
) -> None:
    p = tx_personas
    _hooked(p, hook_server)
    hook_server.status = 500
    counters.flush()
    gave_up_before = counters.value("switchboard_notify_hooks_total", {"outcome": "gave_up"})
    push(p, 1)
    assert wait_for(lambda: Endpoint.objects.get(pk=p.agent.pk).hook_failed_at is not None, 40)
    p.agent.refresh_from_db()
    assert p.agent.hook_error == "hook answered 500"
    assert endpoint_out(p.agent)["hook_error"] == "hook answered 500"
    assert len(hook_server.posts) == 3
    at = [post["at"] for post in hook_server.posts]
    assert all(later - earlier >= 4.5 for earlier, later in itertools.pairwise(at))
    # One message resent: the same webhook-id in each attempt, each signed (hooks10).
    ids = {post["headers"]["webhook-id"] for post in hook_server.posts}
    assert len(ids) == 1 and ids.pop().startswith("msg_")
    assert all(verifies(p.agent.notify_secret, post) for post in hook_server.posts)
    counters.flush()
    assert (
        counters.value("switchboard_notify_hooks_total", {"outcome": "gave_up"})
        == gave_up_before + 1
    )

    admin = Client()
    admin.force_login(p.admin)
    page = admin.get(f"/admin/queues/endpoint/{p.agent.pk}/change/").content.decode()
    assert "hook answered 500" in page

    hook_server.status = 204  # the receiver is back: the next delivery clears the mark
    push(p, 1)
    assert wait_for(lambda: Endpoint.objects.get(pk=p.agent.pk).hook_failed_at is None)
    assert len(hook_server.posts) == 4
    assert (
        hook_server.posts[3]["headers"]["webhook-id"]
        != hook_server.posts[0]["headers"]["webhook-id"]
    )  # another message
    p.agent.refresh_from_db()
    assert p.agent.hook_error == ""


def test_a_new_hook_url_forgets_the_old_ones_failure(
    personas: Personas, hook_server: HookServer
) -> None:
    p = personas
    _hooked(p, hook_server)
    failed = {"hook_failed_at": timezone.now(), "hook_error": "hook answered 302"}
    Endpoint.objects.filter(pk=p.agent.pk).update(**failed)
    services.endpoint_update(endpoint=p.agent, actor=p.as_human(p.owner), name="Other")
    kept = Endpoint.objects.get(pk=p.agent.pk)
    assert endpoint_out(kept)["hook_error"] == "hook answered 302"  # the same URL: kept
    services.endpoint_update(
        endpoint=p.agent, actor=p.as_human(p.owner), notify_url=hook_server.url
    )
    assert Endpoint.objects.get(pk=p.agent.pk).hook_failed_at is not None  # unchanged: kept
    moved = services.endpoint_update(
        endpoint=p.agent, actor=p.as_human(p.owner), notify_url=hook_server.url + "/fixed"
    )
    assert (moved.hook_failed_at, moved.hook_error) == (None, "")
    stored = Endpoint.objects.get(pk=p.agent.pk)
    assert (stored.hook_failed_at, stored.hook_error) == (None, "")


def test_a_resent_hook_names_the_todo_it_first_named_or_is_not_sent(
    tx_personas: Personas, hook_server: HookServer, celery_worker: Any
) -> None:
    """One webhook-id, one body (regress9a): a reminder names the oldest waiting todo; taken
    before the retry, the retry named the next one under the same id. Now it sends nothing."""
    p = tx_personas
    older, _newer = push(p, 2)  # before the hook URL: no hooks of their own
    _hooked(p, hook_server)
    hook_server.status = 500
    deliver_ready_hook.delay(str(p.agent.id), "inbox", None, "waiting")
    assert wait_for(lambda: len(hook_server.posts) == 1, 20)
    assert json.loads(hook_server.posts[0]["body"])["todo"] == str(older.id)
    services.claim(actor=p.as_agent(), todo_id=older.id)  # the work is taken
    time.sleep(settings.HOOK_RETRY_SECONDS * 2 + 2)  # past both retries' times
    assert len(hook_server.posts) == 1, [post["body"] for post in hook_server.posts]
    assert Endpoint.objects.get(pk=p.agent.pk).hook_failed_at is None  # nothing gave up
