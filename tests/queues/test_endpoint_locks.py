"""What an endpoint's change locks (round 10, an outside tester's race): its own row, for no key
update, and nothing else. A PATCH locked its owner's ``auth_user`` row as well (``FOR UPDATE``
through ``select_related``), so a pause, a resume or a priority change, which holds the
ledger's chain and checks its key to that user at commit, deadlocked with it."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from queues import services
from queues.models import Endpoint
from tests.conftest import Personas, database_url, in_thread, lock_waiters


def _runs_without_waiting(change: Callable[[], Any]) -> None:
    """``change`` in a thread of its own finishes, never waiting for a lock."""
    worker, changed = in_thread(change)
    try:
        deadline = time.monotonic() + 30
        while not changed.done():
            assert not lock_waiters(), "the endpoint's change waited for a lock"
            assert time.monotonic() < deadline
            time.sleep(0.01)
    finally:
        worker.join(timeout=60)
    assert changed.exception(timeout=60) is None


@pytest.mark.parametrize(
    "key_share_of", ["auth_user", "queues_endpoint"], ids=["owner", "endpoint"]
)
def test_an_endpoint_change_waits_for_no_commit_that_checks_a_key(
    tx_personas: Personas, key_share_of: str, settings: Any
) -> None:
    """Another transaction holds ``FOR KEY SHARE`` of the owner's row or the endpoint's (what
    a commit's foreign key check of a row naming either takes): a PATCH and a hook secret's
    rotation go on without waiting for it."""
    p = tx_personas
    operator = p.as_human(p.owner)
    settings.HOOK_ALLOWED_NETWORKS = ["127.0.0.1/32"]  # a hook URL, for a secret to rotate
    services.endpoint_update(endpoint=p.agent, actor=operator, notify_url="http://127.0.0.1:9/")
    key = p.owner.pk if key_share_of == "auth_user" else p.agent.pk
    with psycopg.connect(database_url()) as other:
        other.execute(f"SELECT 1 FROM {key_share_of} WHERE id = %s FOR KEY SHARE", [key])
        _runs_without_waiting(
            lambda: services.endpoint_update(endpoint=p.agent, actor=operator, rps=7)
        )
        _runs_without_waiting(
            lambda: services.endpoint_rotate_hook_secret(endpoint=p.agent, actor=operator)
        )
        other.rollback()
    agent = Endpoint.objects.get(pk=p.agent.pk)
    assert agent.rate_limit_rps == 7 and agent.notify_secret_previous
