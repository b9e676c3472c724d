"""A named limit's version: the API's ETag, If-Match and If-None-Match on its PUT and DELETE, and
conditional writes raced on real connections (as for budgets: tests/admission/
test_policy_versions.py)."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from admission.limits import services
from admission.limits.models import Pool, QueueSettings
from switchboard.core import versions
from switchboard.core.errors import PreconditionFailed
from switchboard.ledger.models import LedgerKind
from tests.api.conftest import Api, human_token
from tests.conftest import Personas, audit_rows, run_threads
from tests.limits.conftest import pool

PATH = "/api/v1/limits/pool/gpu"


class Operator(Api):
    """The operator API over ``PATH``, as a human with the limits change permission."""

    def __init__(self, user: Any) -> None:
        super().__init__(Client(), human_token(user))

    def put(self, body: dict[str, Any], **headers: str) -> Any:  # type: ignore[override]
        return super().put(PATH, body, **headers)

    def delete(self, **headers: str) -> Any:  # type: ignore[override]
        return super().delete(PATH, **headers)

    def put_to(self, path: str, body: dict[str, Any], **headers: str) -> Any:
        return super().put(path, body, **headers)

    def listed(self) -> list[dict[str, Any]]:
        return self.get("/api/v1/limits").json()["limits"]


def slots() -> int | None:
    row = Pool.objects.filter(name="gpu").first()
    return row.slots if row is not None else None


def test_a_put_sends_the_version_as_the_etag_and_the_list_shows_it(personas: Personas) -> None:
    api = Operator(personas.admin)
    made = api.put({"slots": 2})
    assert made.status_code == 200
    version = made.json()["version"]
    assert made["ETag"] == f'"{version}"' and len(version) == 20
    assert [limit["version"] for limit in api.listed()] == [version]
    again = api.put({"slots": 2})  # nothing changes: the same version
    assert again["ETag"] == made["ETag"]
    assert api.put({"slots": 3})["ETag"] != made["ETag"]


def test_a_write_over_a_stale_etag_is_412_and_changes_nothing(personas: Personas) -> None:
    api = Operator(personas.admin)
    stale = api.put({"slots": 2})["ETag"]
    fresh = api.put({"slots": 3})["ETag"]  # another operator's change
    rows = audit_rows().count()
    refused = api.put({"slots": 9}, **{"If-Match": stale})
    assert refused.status_code == 412
    body = refused.json()
    assert body["code"] == "precondition_failed" and f'"{body["version"]}"' == fresh
    assert "changed since it was read" in body["error"]
    assert slots() == 3 and audit_rows().count() == rows
    # The change already made, over the stale tag: it holds, so 200 and nothing written.
    assert api.put({"slots": 3}, **{"If-Match": stale}).status_code == 200
    assert audit_rows().count() == rows
    assert api.put({"slots": 9}, **{"If-Match": fresh}).status_code == 200 and slots() == 9
    assert api.delete(**{"If-Match": fresh}).status_code == 412 and slots() == 9
    assert api.delete(**{"If-Match": "*"}).status_code == 204 and slots() is None
    assert api.delete(**{"If-Match": "*"}).status_code == 404  # nothing to delete


def test_if_none_match_star_declares_only_where_it_is_not_declared(personas: Personas) -> None:
    api = Operator(personas.admin)
    missing = api.put({"slots": 1}, **{"If-Match": "*"})
    assert missing.status_code == 412 and missing.json()["version"] is None
    assert slots() is None
    assert api.put({"slots": 1}, **{"If-None-Match": "*"}).status_code == 200
    again = api.put({"slots": 2}, **{"If-None-Match": "*"})
    assert again.status_code == 412 and "is declared now" in again.json()["error"]
    assert slots() == 1
    bad = api.put({"slots": 2}, **{"If-Match": "gpu"})
    assert bad.status_code == 400 and bad.json()["field"] == "If-Match"


def test_the_openapi_document_declares_the_headers_and_412(personas: Personas) -> None:
    doc = Operator(personas.admin).get("/api/v1/openapi.json").json()
    ops = doc["paths"]["/api/v1/limits/{kind}/{name}"]
    for verb, names in (("put", {"If-Match", "If-None-Match"}), ("delete", {"If-Match"})):
        assert "412" in ops[verb]["responses"]
        assert {p["name"] for p in ops[verb]["parameters"] if p["in"] == "header"} == names


def test_of_eight_operators_over_one_version_exactly_one_lands(tx_personas: Personas) -> None:
    read = services.limit_version(services.as_dict(services.KINDS["pool"], pool("gpu", slots=1)))
    actor = tx_personas.as_human(tx_personas.admin)

    def write(i: int) -> str:
        try:
            services.limit_set(actor=actor, kind="pool", name="gpu", expected=(read,), slots=10 + i)
        except PreconditionFailed:
            return "refused"
        return "written"

    outcomes = run_threads(8, write)
    assert sorted(outcomes) == ["refused"] * 7 + ["written"]
    assert slots() == 10 + outcomes.index("written")
    sets = audit_rows().filter(kind=LedgerKind.LIMITS_SET)
    assert sets.count() == 2  # pool()'s declaration, and the winner's


def test_of_eight_declarers_only_where_none_is_exactly_one_declares(
    tx_personas: Personas,
) -> None:
    actor = tx_personas.as_human(tx_personas.admin)

    def declare(i: int) -> str:
        try:
            services.limit_set(
                actor=actor, kind="pool", name="gpu", expected=(versions.ABSENT,), slots=10 + i
            )
        except PreconditionFailed:
            return "refused"
        return "declared"

    outcomes = run_threads(8, declare)
    assert sorted(outcomes) == ["declared"] + ["refused"] * 7
    assert slots() == 10 + outcomes.index("declared")


@pytest.mark.parametrize("expected", [("0" * 20,), (versions.ABSENT,)])
def test_a_conditional_delete_that_does_not_hold_deletes_nothing(
    personas: Personas, expected: tuple[str, ...]
) -> None:
    pool("gpu", slots=1)
    with pytest.raises(PreconditionFailed):
        services.limit_delete(
            actor=personas.as_human(personas.admin), kind="pool", name="gpu", expected=expected
        )
    assert slots() == 1


# A queue's priority settings: the same conditional writes (they were taken unconditionally
# whatever If-Match said, where RFC 9110 13.1.1 has a server evaluate it).
QUEUE_PATH = "/api/v1/limits/queues/inbox"


def priority() -> int | None:
    row = QueueSettings.objects.filter(queue="inbox").first()
    return row.priority if row is not None else None


def test_a_queue_s_settings_are_written_over_the_version_read_or_not_at_all(
    personas: Personas,
) -> None:
    api = Operator(personas.admin)
    made = api.put_to(QUEUE_PATH, {"priority": 2})
    assert made.status_code == 200
    version = made.json()["version"]
    assert made["ETag"] == f'"{version}"' and len(version) == 20
    listed = api.get("/api/v1/limits/status").json()["queues"]
    assert [(q["queue"], q["version"]) for q in listed] == [("inbox", version)]
    fresh = api.put_to(QUEUE_PATH, {"priority": 3})["ETag"]  # another operator's change
    rows = audit_rows().count()
    stale = api.put_to(QUEUE_PATH, {"priority": 9}, **{"If-Match": made["ETag"]})
    assert stale.status_code == 412, stale.content
    body = stale.json()
    assert body["code"] == "precondition_failed" and f'"{body["version"]}"' == fresh
    assert "changed since they were read" in body["error"]
    assert priority() == 3 and audit_rows().count() == rows
    # The change already made, over the stale tag: it holds, so 200 and nothing written.
    assert api.put_to(QUEUE_PATH, {"priority": 3}, **{"If-Match": made["ETag"]}).status_code == 200
    assert audit_rows().count() == rows
    assert api.put_to(QUEUE_PATH, {"priority": 9}, **{"If-Match": fresh}).status_code == 200
    assert priority() == 9
    again = api.put_to(QUEUE_PATH, {"priority": 1}, **{"If-None-Match": "*"})
    assert again.status_code == 412 and "has priority settings now" in again.json()["error"]
    bad = api.put_to(QUEUE_PATH, {"priority": 1}, **{"If-Match": "inbox"})
    assert bad.status_code == 400 and bad.json()["field"] == "If-Match"
    assert priority() == 9
    other = api.put_to("/api/v1/limits/queues/outbox", {"priority": 1}, **{"If-Match": "*"})
    assert other.status_code == 412 and other.json()["version"] is None
    assert not QueueSettings.objects.filter(queue="outbox").exists()
    doc = api.get("/api/v1/openapi.json").json()["paths"]["/api/v1/limits/queues/{queue}"]["put"]
    assert "412" in doc["responses"]
    assert {p["name"] for p in doc["parameters"] if p["in"] == "header"} == {
        "If-Match",
        "If-None-Match",
    }


def test_of_eight_priority_writers_over_one_version_exactly_one_lands(
    tx_personas: Personas,
) -> None:
    actor = tx_personas.as_human(tx_personas.admin)
    read = services.queue_settings_set(actor=actor, queue="inbox", priority=1)["version"]

    def write(i: int) -> str:
        try:
            services.queue_settings_set(
                actor=actor, queue="inbox", priority=10 + i, expected=(read,)
            )
        except PreconditionFailed:
            return "refused"
        return "written"

    outcomes = run_threads(8, write)
    assert sorted(outcomes) == ["refused"] * 7 + ["written"]
    assert priority() == 10 + outcomes.index("written")
    assert audit_rows().filter(kind=LedgerKind.LIMITS_QUEUE).count() == 2


@pytest.mark.parametrize("conditional", [True, False])
def test_eight_first_writers_of_a_queue_s_settings_race_without_a_server_error(
    tx_personas: Personas, conditional: bool
) -> None:
    # Each read no row and inserted one: all but one failed on the unique name (a 500), and
    # every one passed "only where it has none yet".
    actor = tx_personas.as_human(tx_personas.admin)

    def create(i: int) -> str:
        # Unconditional without ``expected`` at all, as callers wrote it before there was one.
        write: Any = services.queue_settings_set
        try:
            write(
                actor=actor,
                queue="inbox",
                priority=10 + i,
                **({"expected": (versions.ABSENT,)} if conditional else {}),
            )
        except PreconditionFailed:
            return "refused"
        return "written"

    outcomes = run_threads(8, create)
    if conditional:
        assert sorted(outcomes) == ["refused"] * 7 + ["written"]
        assert priority() == 10 + outcomes.index("written")
    else:
        assert outcomes == ["written"] * 8
    assert QueueSettings.objects.filter(queue="inbox").count() == 1
    made = audit_rows().filter(kind=LedgerKind.LIMITS_QUEUE).order_by("seq")
    assert made.count() == (1 if conditional else 8) and made[0].before is None
