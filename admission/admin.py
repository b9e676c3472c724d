"""The admin for budgets, their window counters and the ledger.

Budgets are written through ``admission.services.policy_set`` / ``policy_clear`` (so every
change lands in the ledger, exactly as from the API, the CLI or the console). Window counters are
the engine's: read-only. The ledger and its signed head are read-only for everyone, superusers
included: no add, change or delete.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from admission import selectors, services
from admission.models import AdmissionPolicy, AdmissionWindow
from admission.policy import PolicySpec, arguments_from_columns, place_of_field
from queues.access import HumanActor
from switchboard.core.errors import DomainError, InvalidArgument
from switchboard.ledger.admin import ReadOnlyAdmin


def _actor(request: HttpRequest) -> HumanActor:
    return HumanActor(request.user, via="admin")


class AdmissionPolicyForm(forms.ModelForm):
    """Validated by ``PolicySpec.clean``, its field-named errors shown beside the field."""

    class Meta:
        model = AdmissionPolicy
        fields = [
            "endpoint",
            "queue",
            "max_in_flight",
            "max_claims_per_window",
            "window_period",
            "window_tz",
            "window_start",
            "window_weekday",
            "extra_windows",
            "posture",
        ]
        help_texts = {
            "extra_windows": 'Stacked windows after the first, e.g. [{"limit": 1000, "period": '
            '"day", "tz": "Europe/Berlin", "start": "00:00"}]. Every one is charged on each claim.'
        }

    request: HttpRequest | None = None

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if self.errors:
            return data
        # On a change the identity is read-only (not in the form): take it from the row.
        if not self.instance._state.adding:
            data = {**data, "endpoint": self.instance.endpoint, "queue": self.instance.queue}
        endpoint = data.get("endpoint")
        try:
            if self.request is not None and endpoint is not None:
                selectors.endpoint_for(_actor(self.request), endpoint, write=True)
            PolicySpec.clean(**service_arguments(data))
        except InvalidArgument as exc:
            row, column = place_of_field(exc.field)
            field = "queue" if exc.field == "queue" else column if row is None else "extra_windows"
            self.add_error(field if field in self.fields else None, exc.message)
        except DomainError as exc:
            self.add_error("endpoint" if "endpoint" in self.fields else None, exc.message)
        return data


def service_arguments(data: dict[str, Any]) -> dict[str, Any]:
    """The policy's arguments from the model form's columns (the identity's queue included)."""
    return {"queue": data.get("queue") or "", **arguments_from_columns(data)}


@admin.register(AdmissionPolicy)
class AdmissionPolicyAdmin(admin.ModelAdmin):
    form = AdmissionPolicyForm
    list_display = [
        "queue",
        "endpoint",
        "max_in_flight",
        "max_claims_per_window",
        "window",
        "posture",
        "updated_by",
        "updated_at",
    ]
    list_filter = ["posture", "window_period", "endpoint__owner"]
    search_fields = ["queue", "endpoint__slug", "endpoint__name", "window_tz"]
    list_select_related = ["endpoint", "updated_by"]
    readonly_fields = ["created_by", "created_at", "updated_by", "updated_at"]

    @admin.display(description="window")
    def window(self, obj: AdmissionPolicy) -> str:
        return selectors.describe_window(obj) or "—"

    def get_queryset(self, request: HttpRequest) -> QuerySet[AdmissionPolicy]:
        return selectors.visible_policies(_actor(request))

    def get_form(
        self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any
    ) -> Any:
        form = super().get_form(request, obj, change=change, **kwargs)
        form.request = request  # type: ignore[attr-defined]
        return form

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        # The identity of a budget never changes: clear it and set another.
        fixed = ["endpoint", "queue"] if obj is not None else []
        return [*fixed, *self.readonly_fields]

    def save_model(
        self, request: HttpRequest, obj: AdmissionPolicy, form: Any, change: bool
    ) -> None:
        data = {**form.cleaned_data, "endpoint": obj.endpoint, "queue": obj.queue}
        arguments = service_arguments(data)
        try:
            saved = services.policy_set(actor=_actor(request), endpoint=obj.endpoint, **arguments)
        except DomainError as exc:  # e.g. rate_limited, or the endpoint revoked meanwhile
            messages.error(request, f"Not saved: {exc.message}")
            return
        obj.pk = saved.pk
        obj.refresh_from_db()

    def delete_model(self, request: HttpRequest, obj: AdmissionPolicy) -> None:
        services.policy_clear(actor=_actor(request), endpoint=obj.endpoint, queue=obj.queue)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[AdmissionPolicy]) -> None:
        for policy in queryset.select_related("endpoint"):
            services.policy_clear(
                actor=_actor(request), endpoint=policy.endpoint, queue=policy.queue
            )


@admin.register(AdmissionWindow)
class AdmissionWindowAdmin(ReadOnlyAdmin):
    # One row per shard of a window (migration 0007): a window's count is the sum of its rows.
    list_display = [
        "policy",
        "window_key",
        "window_start",
        "shard",
        "used",
        "refused",
        "claims_limit",
        "updated_at",
    ]
    list_filter = ["policy__posture"]
    search_fields = ["policy__queue", "policy__endpoint__slug"]
    list_select_related = ["policy", "policy__endpoint"]
    date_hierarchy = "window_start"
