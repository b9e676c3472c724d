"""Forms of the budget editor and the ledger list.

The policy form only parses what was typed; ``admission.policy.PolicySpec.clean`` /
``policy_set`` decide what is valid, and their ``InvalidArgument.field`` is mapped back onto the
form field it names so the error shows beside it.
"""

from __future__ import annotations

from typing import Any

from django import forms

from admission.models import AdmissionPolicy, Posture, Weekday, WindowPeriod
from admission.policy import (
    COLUMN_OF_FIELD,
    DEFAULT_POSTURE,
    DEFAULT_WINDOW_START,
    PolicySpec,
    arguments_from_columns,
)
from switchboard.core.errors import InvalidArgument
from switchboard.ledger.models import LedgerKind


class PolicyForm(forms.Form):
    max_in_flight = forms.IntegerField(
        required=False,
        label="Max in flight",
        help_text="Claims held at once. Empty: no cap. 0 holds the queue.",
        widget=forms.NumberInput(attrs={"min": 0, "inputmode": "numeric"}),
    )
    max_claims_per_window = forms.IntegerField(
        required=False,
        label="Max claims per window",
        help_text="Claims charged per window (retries and takeovers count). Empty: no window.",
        widget=forms.NumberInput(attrs={"min": 0, "inputmode": "numeric"}),
    )
    window_period = forms.ChoiceField(
        required=False,
        label="Window period",
        choices=[("", "—"), *WindowPeriod.choices],
    )
    window_tz = forms.CharField(
        required=False,
        label="Zone",
        help_text="IANA time zone the window's boundaries are reckoned in; type to search.",
        widget=forms.TextInput(
            attrs={"list": "zones", "autocomplete": "off", "spellcheck": "false"}
        ),
    )
    window_start = forms.CharField(
        required=False,
        label="Start",
        help_text="HH:MM local. For an hourly window only the minutes count.",
        widget=forms.TextInput(attrs={"placeholder": "00:00", "inputmode": "numeric"}),
    )
    window_weekday = forms.ChoiceField(
        required=False,
        label="Weekday",
        help_text="Week windows only.",
        choices=[("", "—"), *Weekday.choices],
    )
    posture = forms.ChoiceField(
        label="Posture",
        choices=Posture.choices,
        initial=Posture.ENFORCE,
        help_text="enforce refuses over-limit claims; advise admits them with a ledger waiver; "
        "off only counts.",
    )

    @classmethod
    def initial_for(cls, policy: AdmissionPolicy | None, zone_name: str) -> dict[str, Any]:
        if policy is None:
            return {
                "window_period": WindowPeriod.DAY,
                "window_tz": zone_name,
                "window_start": DEFAULT_WINDOW_START,
                "posture": DEFAULT_POSTURE,
            }
        return {
            "max_in_flight": policy.max_in_flight,
            "max_claims_per_window": policy.max_claims_per_window,
            "window_period": policy.window_period or WindowPeriod.DAY,
            "window_tz": policy.window_tz or zone_name,
            "window_start": policy.window_start or DEFAULT_WINDOW_START,
            "window_weekday": policy.window_weekday or "",
            "posture": policy.posture,
        }

    def service_kwargs(self) -> dict[str, Any]:
        """Arguments for ``policy_set``/``PolicySpec.clean``. The window fields count only with a
        window limit; the weekday only for a week window (its select keeps a value when the
        period changes)."""
        data = dict(self.cleaned_data)
        if data.get("window_period") != WindowPeriod.WEEK:
            data["window_weekday"] = None
        return arguments_from_columns(data)

    def add_domain_error(self, field: str | None, message: str) -> None:
        """The service's error beside the field it names, in the page's words: the API's field
        name that opens the message is dropped (the field's label stands beside it)."""
        name = COLUMN_OF_FIELD.get(field or "")
        if name is not None and name in self.errors:
            return  # one message per field is enough
        if field and message.startswith(field + " "):
            message = message[len(field) + 1 :]
        self.add_error(name, message)

    def check_every_field(self, queue: str) -> None:
        """Name every wrong field in one submit. ``PolicySpec.clean`` stops at the first error, so it
        runs once per field, with every other field held at a valid value; each refusal lands
        beside the field it names. The service stays the only judge of what is valid."""
        kwargs = self.service_kwargs()
        window = kwargs["window"] or {}
        good_window = {"period": WindowPeriod.DAY, "tz": "UTC", "start": "00:00"}
        base: dict[str, Any] = {
            "max_in_flight": 1,
            "max_claims_per_window": None,
            "window": None,
            "posture": Posture.ENFORCE,
        }
        trials: list[dict[str, Any]] = [{**base, "posture": kwargs["posture"]}]
        if kwargs["max_in_flight"] is not None:
            trials.append({**base, "max_in_flight": kwargs["max_in_flight"]})
        if kwargs["max_claims_per_window"] is not None:
            per_window = {**base, "max_claims_per_window": kwargs["max_claims_per_window"]}
            trials.append({**per_window, "window": good_window})
            trials += [
                {
                    **base,
                    "max_claims_per_window": 1,
                    "window": {**good_window, key: window.get(key)},
                }
                for key in ("period", "tz", "start")
            ]
            if window.get("period") == WindowPeriod.WEEK:
                week = {
                    **good_window,
                    "period": WindowPeriod.WEEK,
                    "weekday": window.get("weekday"),
                }
                trials.append({**base, "max_claims_per_window": 1, "window": week})
        for trial in trials:
            try:
                PolicySpec.clean(queue=queue, **trial)
            except InvalidArgument as exc:
                self.add_domain_error(exc.field, exc.message)


class LedgerFilterForm(forms.Form):
    scope = forms.CharField(required=False, max_length=100)
    queue = forms.CharField(required=False, max_length=64)
    actor = forms.CharField(required=False, max_length=150, help_text="human or endpoint")
    action = forms.ChoiceField(required=False, choices=[("", "any"), *LedgerKind.choices])
    since = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}))
    until = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}))

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        since, until = data.get("since"), data.get("until")
        if since and until and until < since:
            self.add_error("until", "the end of the range is before its start")
        return data
