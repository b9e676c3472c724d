"""A budget's version: conditional writes through the service, raced on real connections, and
the API's ETag, If-Match and If-None-Match.

Two operators who read a budget and change it at once must not overwrite each other unseen: a
write that names the version it read lands only over that version, checked under the budget's
row lock."""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
import pytest
from django.db import connections

from admission import selectors, services
from admission.models import AdmissionPolicy
from switchboard.core import versions
from switchboard.core.errors import NotFound, PreconditionFailed
from switchboard.core.times import iso
from switchboard.ledger.models import LedgerKind
from tests.admission.conftest import budget
from tests.admission.test_api import Api, human, one
from tests.conftest import (
    Personas,
    audit_rows,
    database_url,
    lock_waiters,
    run_threads,
    self_budgeting,
)


def set_as(p: Personas, max_in_flight: int, expected: Any = None) -> AdmissionPolicy:
    return services.policy_set(
        actor=p.as_human(),
        endpoint=p.agent,
        queue="inbox",
        max_in_flight=max_in_flight,
        max_claims_per_window=None,
        window=None,
        expected=expected,
    )


def current() -> AdmissionPolicy | None:
    return AdmissionPolicy.objects.filter(queue="inbox").first()


# --- the version ---------------------------------------------------------------------------------


def test_the_version_changes_with_the_definition_and_with_nothing_else(personas: Personas) -> None:
    p = personas
    assert selectors.policy_version(None) == versions.ABSENT
    first = selectors.policy_version(budget(p, max_in_flight=2))
    assert len(first) == 20 and first != versions.ABSENT
    again = budget(p, max_in_flight=2)  # changes nothing: no ledger row, the same version
    assert selectors.policy_version(again) == first
    assert audit_rows().filter(kind=LedgerKind.POLICY_UPDATE).count() == 0
    changed = budget(p, max_in_flight=3)
    assert selectors.policy_version(changed) not in (first, versions.ABSENT)
    assert selectors.policy_version(budget(p, max_in_flight=2)) == first  # as it was: as it was
    assert selectors.policy_out(changed)["version"] == selectors.policy_version(changed)


# --- conditional writes through the service ------------------------------------------------------


def test_a_write_over_a_version_that_moved_writes_nothing(personas: Personas) -> None:
    p = personas
    read = selectors.policy_version(budget(p, max_in_flight=2))
    moved = budget(p, max_in_flight=5)  # someone else's change, after the read
    rows = audit_rows().count()
    with pytest.raises(PreconditionFailed) as refused:
        set_as(p, 9, expected=(read,))
    assert refused.value.status == 412 and refused.value.code == "precondition_failed"
    assert refused.value.details["version"] == selectors.policy_version(moved)
    assert "changed since it was read (last changed by olive at " in refused.value.message
    # The instant as every answer writes one (it wrote +00:00, cut to the second).
    assert f"at {iso(moved.updated_at)}):" in refused.value.message
    assert current() is not None and current().max_in_flight == 5  # type: ignore[union-attr]
    assert audit_rows().count() == rows
    # The version read now is the one to write over.
    written = set_as(p, 9, expected=(selectors.policy_version(moved),))
    assert written.max_in_flight == 9
    assert audit_rows().count() == rows + 1


def test_a_write_whose_change_is_already_made_succeeds_whatever_was_read(
    personas: Personas,
) -> None:
    # RFC 9110 13.1.1: a change that has already been applied may succeed. A double submit, or
    # a retry whose first answer was lost, finds the budget as it asks: nothing to write.
    p = personas
    read = selectors.policy_version(budget(p, max_in_flight=2))
    set_as(p, 3, expected=(read,))  # the first submit lands
    rows = audit_rows().count()
    again = set_as(p, 3, expected=(read,))  # the second, over the version it read before
    assert again.max_in_flight == 3 and audit_rows().count() == rows
    with pytest.raises(PreconditionFailed):  # a different change over that version is refused
        set_as(p, 4, expected=(read,))


def test_create_only_and_any_budget_mean_what_they_say(personas: Personas) -> None:
    p = personas
    with pytest.raises(PreconditionFailed, match="has no budget now"):
        set_as(p, 1, expected=(versions.ANY,))  # If-Match: * with no budget
    with pytest.raises(PreconditionFailed, match="has no budget now"):
        set_as(p, 1, expected=("0" * 20,))
    assert current() is None and audit_rows().count() == 0
    set_as(p, 1, expected=(versions.ABSENT,))  # If-None-Match: * with none: created
    with pytest.raises(PreconditionFailed, match="has a budget now"):
        set_as(p, 2, expected=(versions.ABSENT,))
    set_as(p, 3, expected=(versions.ANY,))
    assert current().max_in_flight == 3  # type: ignore[union-attr]
    # A list: any member will do.
    set_as(p, 4, expected=("0" * 20, selectors.policy_version(current())))
    assert current().max_in_flight == 4  # type: ignore[union-attr]


def test_a_clear_over_a_version_that_moved_clears_nothing(personas: Personas) -> None:
    p = personas
    read = selectors.policy_version(budget(p, max_in_flight=2))
    budget(p, max_in_flight=5)
    with pytest.raises(PreconditionFailed):
        services.policy_clear(actor=p.as_human(), endpoint=p.agent, queue="inbox", expected=(read,))
    assert current() is not None
    assert audit_rows().filter(kind=LedgerKind.POLICY_DELETE).count() == 0
    services.policy_clear(
        actor=p.as_human(),
        endpoint=p.agent,
        queue="inbox",
        expected=(selectors.policy_version(current()),),
    )
    assert current() is None
    with pytest.raises(NotFound):  # conditional or not, there is nothing to clear
        services.policy_clear(actor=p.as_human(), endpoint=p.agent, queue="inbox", expected=(read,))


# --- raced on real connections -------------------------------------------------------------------


def test_of_eight_writers_over_one_version_exactly_one_lands(tx_personas: Personas) -> None:
    p = tx_personas
    read = selectors.policy_version(budget(p, max_in_flight=1))

    def write(i: int) -> str:
        try:
            set_as(p, 10 + i, expected=(read,))
        except PreconditionFailed:
            return "refused"
        return "written"

    outcomes = run_threads(8, write)
    assert sorted(outcomes) == ["refused"] * 7 + ["written"]
    winner = 10 + outcomes.index("written")
    assert current().max_in_flight == winner  # type: ignore[union-attr]
    assert audit_rows().filter(kind=LedgerKind.POLICY_UPDATE).count() == 1


def test_of_eight_creators_only_where_there_is_none_exactly_one_creates(
    tx_personas: Personas,
) -> None:
    p = tx_personas

    def create(i: int) -> str:
        try:
            set_as(p, 10 + i, expected=(versions.ABSENT,))
        except PreconditionFailed:
            return "refused"
        return "created"

    outcomes = run_threads(8, create)
    assert sorted(outcomes) == ["created"] + ["refused"] * 7
    assert current().max_in_flight == 10 + outcomes.index("created")  # type: ignore[union-attr]
    assert list(audit_rows().values_list("kind", flat=True)) == [LedgerKind.POLICY_CREATE]


def test_the_version_is_checked_under_the_row_lock(tx_personas: Personas) -> None:
    """Writers that read the version while another transaction holds the budget's row, and
    change it there, must all be refused once it commits: a check made before the lock would
    pass them all (the version unchanged when they looked) and each would overwrite."""
    p = tx_personas
    policy = budget(p, max_in_flight=1)
    read = selectors.policy_version(policy)
    outcomes: list[str] = []

    def write(i: int) -> None:
        try:
            set_as(p, 20 + i, expected=(read,))
            outcomes.append("written")
        except PreconditionFailed:
            outcomes.append("refused")
        finally:
            connections.close_all()

    with psycopg.connect(database_url()) as holder:
        holder.execute(
            "UPDATE admission_admissionpolicy SET max_in_flight = 7 WHERE id = %s", [policy.id]
        )
        threads = [threading.Thread(target=write, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 30
        while lock_waiters() < 4 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert lock_waiters() >= 4, "the writers never waited for the row"
        holder.commit()
    for t in threads:
        t.join(timeout=60)
    assert outcomes == ["refused"] * 4
    assert current().max_in_flight == 7  # type: ignore[union-attr]
    assert audit_rows().filter(kind=LedgerKind.POLICY_UPDATE).count() == 0


# --- the API: ETag, If-Match, If-None-Match ------------------------------------------------------


def test_get_and_put_send_the_version_as_the_etag(personas: Personas) -> None:
    p = personas
    api = human(p.owner)
    put = api.put(one(p), {"max_in_flight": 2})
    assert put.status_code == 200
    version = put.json()["policy"]["version"]
    assert put["ETag"] == f'"{version}"'
    got = api.get(one(p))
    assert got["ETag"] == f'"{version}"' and got.json()["policy"]["version"] == version
    listed = api.get("/api/v1/admission").json()["policies"]
    assert [row["policy"]["version"] for row in listed] == [version]


def test_a_put_over_a_stale_etag_is_412_and_changes_nothing(personas: Personas) -> None:
    p = personas
    api = human(p.owner)
    stale = api.put(one(p), {"max_in_flight": 2})["ETag"]
    fresh = api.put(one(p), {"max_in_flight": 3})["ETag"]  # another writer's change
    rows = audit_rows().count()
    refused = api.put(one(p), {"max_in_flight": 9}, **{"If-Match": stale})
    assert refused.status_code == 412
    body = refused.json()
    assert body["code"] == "precondition_failed" and f'"{body["version"]}"' == fresh
    assert current().max_in_flight == 3 and audit_rows().count() == rows  # type: ignore[union-attr]
    ok = api.put(one(p), {"max_in_flight": 9}, **{"If-Match": f"W/{stale}, {fresh}"})
    assert ok.status_code == 200 and ok["ETag"] != fresh
    assert current().max_in_flight == 9  # type: ignore[union-attr]
    # A weak tag never matches a write (strong comparison), even the current one.
    weak = api.put(one(p), {"max_in_flight": 1}, **{"If-Match": f"W/{ok['ETag']}"})
    assert weak.status_code == 412
    # "*" quoted is a tag like any other, not "any budget".
    assert api.put(one(p), {"max_in_flight": 1}, **{"If-Match": '"*"'}).status_code == 412
    assert api.put(one(p), {"max_in_flight": 1}, **{"If-Match": "*"}).status_code == 200
    # The same body again over the stale tag: already applied, so 200 and nothing written.
    rows = audit_rows().count()
    assert api.put(one(p), {"max_in_flight": 1}, **{"If-Match": stale}).status_code == 200
    assert audit_rows().count() == rows


def test_if_none_match_star_creates_only_where_there_is_none(personas: Personas) -> None:
    p = personas
    api = human(p.owner)
    no_budget = api.put(one(p), {"max_in_flight": 1}, **{"If-Match": "*"})
    assert no_budget.status_code == 412 and no_budget.json()["version"] is None
    assert current() is None
    created = api.put(one(p), {"max_in_flight": 1}, **{"If-None-Match": "*"})
    assert created.status_code == 200
    again = api.put(one(p), {"max_in_flight": 2}, **{"If-None-Match": "*"})
    assert again.status_code == 412 and "has a budget now" in again.json()["error"]
    assert current().max_in_flight == 1  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("headers", "field"),
    [
        ({"If-Match": "abc"}, "If-Match"),
        ({"If-Match": '"a" "b"'}, "If-Match"),
        ({"If-Match": ""}, "If-Match"),
        ({"If-Match": '"unterminated'}, "If-Match"),
        ({"If-None-Match": '"abc"'}, "If-None-Match"),
        ({"If-Match": "*", "If-None-Match": "*"}, "If-None-Match"),
    ],
)
def test_a_malformed_precondition_is_400_naming_the_header(
    personas: Personas, headers: dict[str, str], field: str
) -> None:
    p = personas
    api = human(p.owner)
    api.put(one(p), {"max_in_flight": 2})
    rows = audit_rows().count()
    refused = api.put(one(p), {"max_in_flight": 9}, **headers)
    assert refused.status_code == 400, refused.content
    assert refused.json()["code"] == "invalid_argument" and refused.json()["field"] == field
    assert current().max_in_flight == 2 and audit_rows().count() == rows  # type: ignore[union-attr]


def test_a_delete_honours_if_match(personas: Personas) -> None:
    p = personas
    api = human(p.owner)
    stale = api.put(one(p), {"max_in_flight": 2})["ETag"]
    fresh = api.put(one(p), {"max_in_flight": 3})["ETag"]

    def delete(tag: str) -> Any:
        return api.delete(one(p), **{"If-Match": tag})

    assert delete(stale).status_code == 412 and current() is not None
    assert delete(fresh).status_code == 204 and current() is None
    assert delete("*").status_code == 404  # nothing to clear: not_found, as without If-Match
    assert audit_rows().filter(kind=LedgerKind.POLICY_DELETE).count() == 1


# --- an agent's own budget verbs ------------------------------------------------------------------


def _self_budgeting(p: Personas) -> tuple[Any, Api]:
    endpoint, token = self_budgeting(p)
    return endpoint, Api(token)


def _agent_version(api: Api) -> str | None:
    status = api.post("/api/v1/agent/admission_status", {"queue": "inbox"}).json()
    policy = status["queues"][0]["policy"]
    return policy["version"] if policy else None


def test_an_agent_writes_its_own_budget_over_the_version_it_read(personas: Personas) -> None:
    # The agents' verbs wrote whatever was there: an agent's set over an operator's change
    # made since the agent read the budget lost that change without a word.
    endpoint, api = _self_budgeting(personas)
    verb = "/api/v1/agent/set_admission_policy"
    created = api.post(
        verb, {"queue": "inbox", "policy": {"max_in_flight": 2}, "if_version": "none"}
    )
    assert created.status_code == 200, created.content
    read = _agent_version(api)
    assert read == created.json()["policy"]["version"]
    # An operator changes it; the agent's write over what it read is refused and writes nothing.
    services.policy_set(
        actor=personas.as_human(), endpoint=endpoint, queue="inbox", max_in_flight=5,
        max_claims_per_window=None, window=None,
    )  # fmt: skip
    now = _agent_version(api)
    for body in (
        {"queue": "inbox", "policy": {"max_in_flight": 3}, "if_version": read},
        {"queue": "inbox", "policy": {"max_in_flight": 3}, "if_version": "none"},
    ):
        refused = api.post(verb, body)
        assert refused.status_code == 412, refused.content
        assert refused.json()["code"] == "precondition_failed"
        assert refused.json()["version"] == now
    cleared = api.post(
        "/api/v1/agent/clear_admission_policy", {"queue": "inbox", "if_version": read}
    )
    assert cleared.status_code == 412
    assert AdmissionPolicy.objects.get(endpoint=endpoint).max_in_flight == 5
    # Over the version as it is now, both go through.
    again = api.post(verb, {"queue": "inbox", "policy": {"max_in_flight": 3}, "if_version": now})
    assert again.status_code == 200 and again.json()["policy"]["max_in_flight"] == 3
    latest = _agent_version(api)
    cleared = api.post(
        "/api/v1/agent/clear_admission_policy", {"queue": "inbox", "if_version": latest}
    )
    assert cleared.status_code == 200 and cleared.json()["policy"] is None
    # Without if_version, unconditional as before; a malformed one names the field.
    assert api.post(verb, {"queue": "inbox", "policy": {"max_in_flight": 1}}).status_code == 200
    bad = api.post(verb, {"queue": "inbox", "policy": {"max_in_flight": 1}, "if_version": "*"})
    assert bad.status_code == 400 and bad.json()["field"] == "if_version"


def test_of_eight_agents_writing_over_one_version_exactly_one_lands(
    tx_personas: Personas,
) -> None:
    p = tx_personas
    endpoint, api = _self_budgeting(p)
    api.post(
        "/api/v1/agent/set_admission_policy", {"queue": "inbox", "policy": {"max_in_flight": 1}}
    )
    read = _agent_version(api)

    def write(i: int) -> int:
        body = {"queue": "inbox", "policy": {"max_in_flight": 10 + i}, "if_version": read}
        return int(Api(api.headers["Authorization"][7:]).post(
            "/api/v1/agent/set_admission_policy", body
        ).status_code)  # fmt: skip

    outcomes = run_threads(8, write)
    assert sorted(outcomes) == [200] + [412] * 7
    winner = 10 + outcomes.index(200)
    assert AdmissionPolicy.objects.get(endpoint=endpoint).max_in_flight == winner
    assert audit_rows().filter(kind=LedgerKind.POLICY_UPDATE).count() == 1
