"""A named limit's version: the API's ETag, If-Match and If-None-Match on its PUT and DELETE, and
conditional writes raced on real connections (as for budgets: tests/admission/
test_policy_versions.py)."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from admission.limits import services
from admission.limits.models import Pool
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
