"""One policy spec (admission/policy.py): every surface takes its names, bounds and defaults from
it and converts through it, so a budget has one shape from the form to the ledger."""

from __future__ import annotations

import pytest

from admission.admin import AdmissionPolicyForm, service_arguments
from admission.forms import PolicyForm
from admission.models import AdmissionPolicy
from admission.policy import (
    COLUMN_OF_FIELD,
    DEFAULT_POSTURE,
    DEFAULT_WINDOW_START,
    FIELD_OF_CONSTRAINT,
    MAX_CLAIMS_PER_WINDOW,
    MAX_IN_FLIGHT,
    PolicySpec,
)
from admission.schemas import PolicyIn, WindowIn
from admission.selectors import policy_dict
from switchboard.core.errors import InvalidArgument
from tests.admission.conftest import budget
from tests.conftest import Personas, audit_rows

COLUMNS = {
    "max_in_flight": 3,
    "max_claims_per_window": 50,
    "window_period": "week",
    "window_tz": "Europe/Berlin",
    "window_start": "06:30",
    "window_weekday": "Tue",
    "posture": "advise",
}


def test_the_api_and_mcp_schemas_take_their_bounds_and_defaults_from_the_spec() -> None:
    schema = PolicyIn.model_json_schema()
    props = schema["properties"]
    assert props["posture"]["default"] == DEFAULT_POSTURE
    assert WindowIn.model_json_schema()["properties"]["start"]["default"] == DEFAULT_WINDOW_START
    limits = {
        name: next(b for b in props[name]["anyOf"] if b.get("type") == "integer")
        for name in ("max_in_flight", "max_claims_per_window")
    }
    assert limits["max_in_flight"]["maximum"] == MAX_IN_FLIGHT
    assert limits["max_claims_per_window"]["maximum"] == MAX_CLAIMS_PER_WINDOW


def test_the_console_form_and_the_admin_give_the_same_spec_for_the_same_columns() -> None:
    form = PolicyForm(data=COLUMNS)
    assert form.is_valid(), form.errors
    from_form = PolicySpec.clean(queue="inbox", **form.service_kwargs())
    from_admin = PolicySpec.clean(**service_arguments({"queue": "inbox", **COLUMNS}))
    assert from_form == from_admin
    assert from_form.columns() == {**COLUMNS, "extra_windows": []}


def test_a_stored_policy_reads_back_as_the_spec_it_was_written_from(personas: Personas) -> None:
    policy = budget(personas, per="week", limit=50, weekday="Tue", max_in_flight=3)
    spec = PolicySpec.of(policy)
    assert spec == PolicySpec.clean(
        queue="inbox",
        max_in_flight=3,
        max_claims_per_window=50,
        window={"period": "week", "tz": "UTC", "start": "00:00", "weekday": "Tue"},
        posture="enforce",
    )
    (row,) = audit_rows()
    assert row.after == spec.audited(policy.endpoint_id) == policy_dict(policy)


def test_every_field_a_refusal_names_is_a_field_of_the_form_and_of_the_admin() -> None:
    admin_fields = set(AdmissionPolicyForm.Meta.fields)
    for column in COLUMN_OF_FIELD.values():
        assert column in PolicyForm.base_fields and column in admin_fields
    constraints = {c.name for c in AdmissionPolicy._meta.constraints}
    assert set(FIELD_OF_CONSTRAINT) <= constraints
    # "windows" (the stacked list as a whole) is shown above the form, not beside a field.
    assert set(FIELD_OF_CONSTRAINT.values()) <= {*COLUMN_OF_FIELD, "windows"}


@pytest.mark.parametrize(
    ("columns", "field"),
    [
        ({**COLUMNS, "window_tz": "Mars/Olympus"}, "window.tz"),
        ({**COLUMNS, "window_start": "25:00"}, "window.start"),
        ({**COLUMNS, "window_period": "day"}, "window.weekday"),
    ],
)
def test_the_admin_refuses_through_the_spec_naming_the_field(
    columns: dict[str, object], field: str
) -> None:
    with pytest.raises(InvalidArgument) as refused:
        PolicySpec.clean(**service_arguments({"queue": "inbox", **columns}))
    assert refused.value.field == field
