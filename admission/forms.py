"""Forms of the budget editor and the ledger list.

The policy form only parses what was typed; ``admission.policy.PolicySpec.clean`` /
``policy_set`` decide what is valid, and their ``InvalidArgument.field`` is mapped back onto the
form field it names so the error shows beside it.
"""

from __future__ import annotations

import re
from typing import Any

from django import forms

from admission.models import MAX_WINDOWS, AdmissionPolicy, Posture, Weekday, WindowPeriod
from admission.policy import (
    DEFAULT_POSTURE,
    DEFAULT_WINDOW_START,
    PolicySpec,
    arguments_from_columns,
    place_of_field,
)
from switchboard.core.errors import InvalidArgument
from switchboard.ledger.models import LedgerKind


class WindowRowForm(forms.Form):
    """One stacked window after the first: at most ``limit`` claims per its window."""

    limit = forms.IntegerField(
        required=False,
        label="Max claims",
        help_text="Claims charged per this window. Empty (or Remove): no such window.",
        widget=forms.NumberInput(attrs={"min": 0, "inputmode": "numeric"}),
    )
    period = forms.ChoiceField(
        required=False, label="Period", choices=[("", "—"), *WindowPeriod.choices]
    )
    tz = forms.CharField(
        required=False,
        label="Zone",
        widget=forms.TextInput(
            attrs={"list": "zones", "autocomplete": "off", "spellcheck": "false"}
        ),
    )
    start = forms.CharField(
        required=False,
        label="Start",
        widget=forms.TextInput(attrs={"placeholder": "00:00", "inputmode": "numeric"}),
    )
    weekday = forms.ChoiceField(
        required=False, label="Weekday", choices=[("", "—"), *Weekday.choices]
    )

    def window(self) -> dict[str, Any] | None:
        """The window as ``PolicySpec.clean`` takes it; None for a blank or removed row."""
        data = self.cleaned_data
        if data.get("DELETE") or (data.get("limit") is None and not (data.get("tz") or "").strip()):
            return None
        item: dict[str, Any] = {
            "limit": data.get("limit"),
            "period": data.get("period") or None,
            "tz": (data.get("tz") or "").strip() or None,
            "start": (data.get("start") or "").strip() or None,
        }
        if data.get("weekday") and item["period"] == WindowPeriod.WEEK:
            item["weekday"] = data["weekday"]
        return item


# The stacked windows after the first (the first is the policy form's own window fields).
WindowRows = forms.formset_factory(
    WindowRowForm, extra=0, can_delete=True, max_num=MAX_WINDOWS - 1, absolute_max=MAX_WINDOWS - 1
)
ROWS_PREFIX = "more"


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

    def __init__(
        self,
        data: Any = None,
        *,
        initial: dict[str, Any] | None = None,
        rows: list[dict[str, Any]] | None = None,
        add_row: bool = False,
    ) -> None:
        super().__init__(data, initial=initial)
        # The stacked windows' rows; add_row appends a blank one (the "Add a window" button).
        # A post without the rows' management form (a client of the single-window form) sends
        # no stacked windows: the rows are then unbound and empty.
        sent = data is not None and f"{ROWS_PREFIX}-TOTAL_FORMS" in data
        self.rows = WindowRows(data if sent else None, prefix=ROWS_PREFIX, initial=rows)
        self.add_row = add_row and self.rows.total_form_count() < MAX_WINDOWS - 1
        self._extra_rows: list[int] = []  # form index of each stacked window sent to the spec

    def is_valid(self) -> bool:
        # Always run (errors shown beside every row); unbound rows are no rows.
        rows_valid = self.rows.is_valid() if self.rows.is_bound else True
        return super().is_valid() and rows_valid

    @property
    def blank_row(self) -> forms.Form | None:
        """The row the "Add a window" button asked for, numbered after the sent ones."""
        if not self.add_row:
            return None
        row = self.rows.empty_form
        row.prefix = self.rows.add_prefix(self.rows.total_form_count())
        return row

    @property
    def row_count(self) -> int:
        """Rows on the page (the management form's TOTAL_FORMS)."""
        return self.rows.total_form_count() + (1 if self.add_row else 0)

    @property
    def error_count(self) -> int:
        return len(self.errors) + sum(len(f.errors) for f in self.rows.forms)

    def first_error(self) -> str | None:
        """The HTML name of the first field in error (main fields first, then the rows)."""
        named = [name for name in self.fields if name in self.errors]
        if named:
            return named[0]
        for row in self.rows.forms:
            for name in row.fields:
                if name in row.errors:
                    return row.add_prefix(name)
        return None

    @property
    def has_errors(self) -> bool:
        return bool(self.errors) or any(f.errors for f in self.rows.forms)

    @staticmethod
    def rows_for(policy: AdmissionPolicy | None) -> list[dict[str, Any]]:
        """The stacked windows of a stored policy as the rows' initial data."""
        if policy is None:
            return []
        return [
            {**item, "weekday": item.get("weekday") or ""}
            for item in PolicySpec.of(policy).columns()["extra_windows"]
        ]

    def extra_windows(self) -> list[dict[str, Any]]:
        self._extra_rows = []
        out = []
        for i, row in enumerate(self.rows.forms):
            if not hasattr(row, "cleaned_data"):
                continue
            item = row.window()
            if item is not None:
                self._extra_rows.append(i)
                out.append(item)
        return out

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
        data["extra_windows"] = self.extra_windows()
        return arguments_from_columns(data)

    def add_domain_error(self, field: str | None, message: str) -> None:
        """The service's error beside the field it names, in the page's words: the API's field
        name that opens the message is dropped (the field's label stands beside it), and any
        other it names reads as that field's label here (``labelled``). A stacked window's field
        (``windows[2].tz``) lands on its row."""
        row, name = place_of_field(field)
        if field and message.startswith(field + " "):
            message = message[len(field) + 1 :]
        message = labelled(message)
        if row is not None and row < len(self._extra_rows):
            target = self.rows.forms[self._extra_rows[row]]
            if name not in target.errors:
                target.add_error(name, message)
            return
        if name is not None and name in self.errors:
            return  # one message per field is enough
        if name is None and message in self.non_field_errors():
            return
        self.add_error(name, message)

    def check_every_field(self, queue: str) -> None:
        """Name every wrong field in one submit. ``PolicySpec.clean`` stops at the first error, so it
        runs once per field, with every other field held at a valid value; each refusal lands
        beside the field it names. The service stays the only judge of what is valid."""
        kwargs = self.service_kwargs()
        if kwargs.get("windows"):  # stacked: the first window's trials read its columns
            first = dict(kwargs["windows"][0])
            kwargs["max_claims_per_window"] = first.pop("limit")
            kwargs["window"] = first
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
            # Each of period, zone and start tried with the others held valid; a week's period
            # with a valid weekday too (the weekday's own trial, below, judges the one given).
            held = {key: good_window for key in ("period", "tz", "start")}
            if window.get("period") == WindowPeriod.WEEK:
                held["period"] = {**good_window, "weekday": Weekday.MON}
            trials += [
                {
                    **base,
                    "max_claims_per_window": 1,
                    "window": {**held[key], key: window.get(key)},
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
        trials += self._row_trials(base)
        for trial in trials:
            try:
                PolicySpec.clean(queue=queue, **trial)
            except InvalidArgument as exc:
                self.add_domain_error(exc.field, exc.message)

    def _row_trials(self, base: dict[str, Any]) -> list[dict[str, Any]]:
        """One trial per field of each stacked window, every other field held valid, each row
        placed at its own index (so a refusal names that row); the rows of a trial are
        distinct from one another by their zone."""
        if not hasattr(self, "cleaned_data"):
            return []
        items = self.extra_windows()
        good = [
            {"limit": 1, "period": WindowPeriod.DAY, "tz": f"Etc/GMT-{i + 1}", "start": "00:00"}
            for i in range(len(items) + 1)
        ]
        trials = []
        for i, item in enumerate(items):
            held = dict(good[i + 1])
            if item.get("period") == WindowPeriod.WEEK:
                held.update(period=WindowPeriod.WEEK, weekday=item.get("weekday"))
            for key in ("limit", "period", "tz", "start"):
                rows = [*good[: i + 1], {**held, key: item.get(key)}, *good[i + 2 :]]
                trials.append({**base, "windows": rows})
            if item.get("period") == WindowPeriod.WEEK:
                trials.append({**base, "windows": [*good[: i + 1], held, *good[i + 2 :]]})
        return trials


# The API's names of a budget's fields as the service's messages write them (``max_in_flight``,
# ``window.weekday``, ``windows[1].tz``, the ``tz`` of "same period, tz, start and weekday").
_API_NAME_RE = re.compile(
    r"\bwindows\[(?P<row>\d+)\](?:\.(?P<key>\w+))?"
    r"|\bwindow\.\w+"
    r"|\b(?:max_in_flight|max_claims_per_window|tz)\b"
)
# What the user typed, quoted in a message (``'europe/berlin' is not a known ...``): kept as
# typed. (An apostrophe inside a word, as in "queue's", opens no quote.)
_QUOTED_RE = re.compile(r"""((?<!\w)(?:'[^']*'|"[^"]*")(?!\w))""")


def _label_of(match: re.Match[str]) -> str:
    """One API name as the budget page labels its field: the first window's fields are the
    policy form's own (``window.weekday``, ``windows[0].weekday``: "Weekday"), a stacked
    window's are its row's, by the row's number on the page (``windows[1].weekday``: "Window 2's
    weekday"; ``windows[1]``: "Window 2")."""
    name = match[0]
    if name == "tz":
        return "zone"  # the bare ``tz`` of a window's parts, listed
    if match["row"] is not None and match["key"] is None:
        number = int(match["row"]) + 1
        return f"Window {number}" if number > 1 else "the first window"
    row, column = place_of_field(name)
    if row is None:
        field = PolicyForm.base_fields.get(column or "")
        return str(field.label) if field else name
    field = WindowRowForm.base_fields.get(column or "")
    return f"Window {row + 2}'s {str(field.label).lower()}" if field else name


def labelled(message: str) -> str:
    """A service message (written with the API's field names, as the API answers it) in the
    budget page's words: each field it names reads as that field's label on the page. What the
    user typed, quoted in it, is left as typed."""
    parts = _QUOTED_RE.split(message)
    return "".join(
        part if i % 2 else _API_NAME_RE.sub(_label_of, part) for i, part in enumerate(parts)
    )


class IsoDateField(forms.DateField):
    """A date as the page's date input sends it: YYYY-MM-DD in ASCII digits. Django's default
    formats also read 07/12/2026, as 12 July, where a reader of day-first dates means 7
    December, and strptime reads other scripts' digits."""

    input_formats = ["%Y-%m-%d"]
    default_error_messages = {"invalid": "Enter a date as YYYY-MM-DD."}

    def to_python(self, value: Any) -> Any:
        if isinstance(value, str) and not value.isascii():
            raise forms.ValidationError(self.error_messages["invalid"], code="invalid")
        return super().to_python(value)


class LedgerFilterForm(forms.Form):
    scope = forms.CharField(required=False, max_length=100)
    queue = forms.CharField(required=False, max_length=64)
    actor = forms.CharField(required=False, max_length=150, help_text="human or endpoint")
    action = forms.ChoiceField(required=False, choices=[("", "any"), *LedgerKind.choices])
    # Labelled as the page shows them: an error names the field by its label.
    since = IsoDateField(
        required=False, label="From", widget=forms.DateInput(attrs={"type": "date"})
    )
    until = IsoDateField(required=False, label="To", widget=forms.DateInput(attrs={"type": "date"}))

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        since, until = data.get("since"), data.get("until")
        if since and until and until < since:
            self.add_error("until", "the end of the range is before its start")
        return data
