"""A window's counter rules in their cheaper form (admission migration 0011, issue 12): the same
rows refused under the same constraint names, now that the domains of the counter columns carry
them rather than CHECKs of the table; and the shape that keeps a charge from paying for them (no
CHECK on the table, so none is rebuilt in every statement that writes a counter)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.db import connection

from admission.models import WINDOW_SHARDS, AdmissionWindow
from queues import services
from tests.admission.test_claims import claimed
from tests.admission.test_policies import set_policy
from tests.conftest import Personas, push
from tests.queues.test_checks import _refused_by  # SQLSTATE 23514, and the rule it names

# rule -> (column, its domain)
RULES = {
    "window_used_nonnegative": ("used", "admission_window_used"),
    "window_refused_nonnegative": ("refused", "admission_window_refused"),
    "window_shard_range": ("shard", "admission_window_shard"),
}

REFUSED = [
    ("window_used_nonnegative", "used", "-1"),
    ("window_refused_nonnegative", "refused", "-1"),
    ("window_shard_range", "shard", "-1"),
    ("window_shard_range", "shard", str(WINDOW_SHARDS)),
]

ACCEPTED = [
    ("used", "0"),
    ("used", "2147483647"),
    ("refused", "0"),
    ("shard", "0"),
    ("shard", str(WINDOW_SHARDS - 1)),
]

START = datetime(2026, 12, 3, tzinfo=UTC)


def _insert(policy_id: Any, column: str, value: str, start: datetime = START) -> tuple[str, list]:
    row = {"used": "0", "refused": "0", "shard": "0", column: value}
    statement = (
        "INSERT INTO admission_admissionwindow"
        " (policy_id, window_key, window_start, shard, used, refused, updated_at)"
        f" VALUES (%s, '', %s, {row['shard']}, {row['used']}, {row['refused']}, now())"
    )
    return statement, [policy_id, start]


def _rows() -> list[tuple[Any, ...]]:
    return list(AdmissionWindow.objects.order_by("id").values_list("shard", "used", "refused"))


@pytest.mark.parametrize(("rule", "column", "value"), REFUSED)
def test_each_rule_refuses_an_insert_and_an_update_under_its_name(
    personas: Personas, rule: str, column: str, value: str
) -> None:
    policy = set_policy(personas)
    AdmissionWindow.objects.create(policy=policy, window_start=START, shard=1, used=3, refused=2)
    before = _rows()
    assert (
        _refused_by(*_insert(policy.pk, column, value, datetime(2026, 12, 4, tzinfo=UTC))) == rule
    )
    update = f"UPDATE admission_admissionwindow SET {column} = {value} WHERE policy_id = %s"
    assert _refused_by(update, [policy.pk]) == rule
    # The charge's own form (the column from itself): a step below zero is refused too.
    if column != "shard":
        step = f"UPDATE admission_admissionwindow SET {column} = {column} - 4 WHERE policy_id = %s"
        assert _refused_by(step, [policy.pk]) == rule
    assert _rows() == before


@pytest.mark.parametrize(("column", "value"), ACCEPTED)
def test_each_rule_accepts_what_it_accepted(personas: Personas, column: str, value: str) -> None:
    policy = set_policy(personas)
    with connection.cursor() as cur:
        cur.execute(*_insert(policy.pk, column, value))
        cur.execute(
            f"UPDATE admission_admissionwindow SET {column} = {value} WHERE policy_id = %s",
            [policy.pk],
        )
    (row,) = AdmissionWindow.objects.filter(policy=policy)
    assert getattr(row, column) == int(value)  # read back as the integer it is


def test_a_charge_goes_through_the_domains_and_reads_back_as_integers(
    personas: Personas,
) -> None:
    p = personas
    set_policy(p, max_claims_per_window=5)
    push(p, 2)
    for _ in range(2):
        got = claimed(services.claim_next(actor=p.as_agent()))
        assert got.admission is not None
    rows = list(AdmissionWindow.objects.values_list("shard", "used", "refused"))
    assert sum(used for _, used, _ in rows) == 2
    assert all(type(v) is int for row in rows for v in row)
    with connection.cursor() as cur:
        cur.execute("SELECT shard, used, refused FROM admission_admissionwindow LIMIT 1")
        assert all(type(v) is int for v in cur.fetchone())


def test_model_validation_still_runs_the_rules(personas: Personas) -> None:
    policy = set_policy(personas)
    for column, value in (("used", -1), ("refused", -1), ("shard", WINDOW_SHARDS)):
        window = AdmissionWindow(policy=policy, window_start=START, **{column: value})
        with pytest.raises(ValidationError) as err:
            window.full_clean()
        rule = next(r for r, (c, _) in RULES.items() if c == column)
        assert rule in str(err.value)


def test_no_charge_pays_for_a_rule_it_cannot_break(db: None) -> None:
    """A CHECK is parsed from its stored text and planned in every statement that writes a row
    of its table, whatever the statement sets; a domain's CHECK is kept planned for the session
    and checked only where a value of its type is assigned. So: no CHECK on the table, and each
    counter column's type is the domain whose CHECK carries its rule, under the rule's name."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT conname FROM pg_constraint WHERE contype = 'c'"
            " AND conrelid = 'admission_admissionwindow'::regclass"
        )
        assert cur.fetchall() == []
        cur.execute(
            "SELECT a.attname, t.typname, c.conname, pg_get_constraintdef(c.oid)"
            " FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid"
            " JOIN pg_constraint c ON c.contypid = t.oid"
            " WHERE a.attrelid = 'admission_admissionwindow'::regclass AND t.typtype = 'd'"
        )
        found = {rule: (column, domain, check) for column, domain, rule, check in cur.fetchall()}
    assert {rule: found[rule][:2] for rule in found} == RULES
    assert found["window_shard_range"][2] == f"CHECK (((VALUE >= 0) AND (VALUE < {WINDOW_SHARDS})))"
    assert found["window_used_nonnegative"][2] == "CHECK ((VALUE >= 0))"
    assert found["window_refused_nonnegative"][2] == "CHECK ((VALUE >= 0))"
