"""Forms of the board: parse what was typed; the services decide what is allowed."""

from __future__ import annotations

import json
from typing import Any

from django import forms

from queues.pauses import MAX_REASON
from switchboard.core import validation
from switchboard.core.errors import InvalidArgument


class PauseForm(forms.Form):
    # Required-ness and length are checked by queues.pauses (its error names the field); the form
    # only carries the text back when the service refuses it.
    reason = forms.CharField(
        required=False,
        max_length=MAX_REASON,
        widget=forms.TextInput(attrs={"placeholder": "why: e.g. upgrading the consumer"}),
    )


class TodoCompleteForm(forms.Form):
    summary = forms.CharField(required=False, widget=forms.TextInput())
    result = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 2}),
        help_text="Optional JSON; plain text is stored as a string.",
    )

    def clean_result(self) -> Any:
        raw = self.cleaned_data["result"].strip()
        if not raw:
            return None
        try:
            value = validation.loads(raw, "result")
        except InvalidArgument as exc:
            if not _no_json_at_all(raw):
                raise forms.ValidationError(exc.message) from None
            return raw
        return value


def _no_json_at_all(raw: str) -> bool:
    """Whether ``raw`` is text that is no JSON (kept as a string), not JSON a client's may not
    be: a number past the digit limit ("is not valid JSON" too) or too deep, NaN, a name given
    twice are refused, as the API refuses them."""
    try:
        json.loads(raw)
    except json.JSONDecodeError:
        return True
    except (ValueError, RecursionError):
        return False
    return False


class TodoFailForm(forms.Form):
    error = forms.CharField(required=False, widget=forms.TextInput())
    summary = forms.CharField(required=False, widget=forms.TextInput())


class TimezoneForm(forms.Form):
    tz = forms.CharField(
        label="Your time zone",
        max_length=64,
        widget=forms.TextInput(
            attrs={"list": "zones", "autocomplete": "off", "spellcheck": "false"}
        ),
    )
