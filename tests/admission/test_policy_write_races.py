"""Two people writing one budget at once (races11, an outside tester): each write either lands
or is refused for what it found, never "no budget" for a budget that is there, never a 500."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest

from admission import services as admission_services
from admission.models import AdmissionPolicy
from tests.conftest import Personas, database_url, in_thread, until_a_lock_waits

WINDOW = {"limit": 5, "period": "day", "tz": "UTC", "start": "00:00"}


def _set(p: Personas, user: Any, limit: int = 5) -> AdmissionPolicy:
    policy: AdmissionPolicy = admission_services.policy_set(
        actor=p.as_human(user),
        endpoint=p.agent,
        queue="inbox",
        max_in_flight=limit,
        max_claims_per_window=None,
        window=None,
        windows=[WINDOW],
    )
    return policy


@pytest.fixture(autouse=True)
def _unlimited_writes(settings: Any) -> None:
    settings.POLICY_WRITE_RATE_LIMIT = (0, 0)


def test_a_clear_waiting_for_another_persons_write_clears_the_budget(
    tx_personas: Personas,
) -> None:
    """The owner clears a budget while the admin's change of it is uncommitted: the clear waits
    for it and then removes the budget. Its lock joined the editor's row, checked again as first
    read once the admin's write committed: the row no longer matched, and the clear said
    "no budget"."""
    p = tx_personas
    policy = _set(p, p.owner)
    with psycopg.connect(database_url()) as admin_write:
        admin_write.execute(
            "UPDATE admission_admissionpolicy SET updated_by_id = %s, max_in_flight = 6 "
            "WHERE id = %s",
            [p.admin.pk, policy.pk],
        )
        clearer, cleared = in_thread(
            lambda: admission_services.policy_clear(
                actor=p.as_human(p.owner), endpoint=p.agent, queue="inbox"
            )
        )
        until_a_lock_waits("the clear", "%admission_admissionpolicy%")  # for the admin's write
        admin_write.commit()
    clearer.join(timeout=60)
    assert cleared.exception(timeout=60) is None and isinstance(cleared.result(), dict)
    assert cleared.result()["max_in_flight"] == 6  # what it removed: the admin's budget
    assert not AdmissionPolicy.objects.filter(pk=policy.pk).exists()


def test_a_set_whose_create_lost_to_a_budget_cleared_again_creates_it(
    tx_personas: Personas, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The owner sets a budget none had: the admin's create commits first (the owner's create
    fails on the identity), then the admin clears it before the owner looks again. The owner's
    write creates it after all; it asserted the budget was there, a 500."""
    p = tx_personas
    real_lock = admission_services._lock
    looks: list[bool] = []

    def in_thread_of_its_own(call: Any) -> None:
        in_thread(call)[1].result(timeout=60)

    owner_thread = threading.current_thread()

    def interleaved(endpoint: Any, queue: str) -> Any:
        if threading.current_thread() is not owner_thread:  # the admin's writes: as they are
            return real_lock(endpoint, queue)
        looks.append(True)
        if len(looks) == 2:  # after the owner's create failed: the admin clears the budget
            in_thread_of_its_own(
                lambda: admission_services.policy_clear(
                    actor=p.as_human(p.admin), endpoint=p.agent, queue="inbox"
                )
            )
        found = real_lock(endpoint, queue)
        if len(looks) == 1:  # none yet: the admin's create lands before the owner's
            in_thread_of_its_own(lambda: _set(p, p.admin, limit=9))
        return found

    monkeypatch.setattr(admission_services, "_lock", interleaved)
    policy = _set(p, p.owner, limit=3)
    assert len(looks) == 2
    assert AdmissionPolicy.objects.get(pk=policy.pk).max_in_flight == 3
