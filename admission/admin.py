"""The admin for budgets, their window counters and the ledger's rows.

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
from django.http import HttpRequest, HttpResponseRedirect
from django.urls import reverse

from admission import selectors, services
from admission.models import AdmissionPolicy, AdmissionWindow
from admission.policy import PolicySpec, arguments_from_columns, place_of_field
from admission.schemas import WindowLimitIn
from queues.access import HumanActor, visible_endpoints
from queues.models import EndpointState
from switchboard.core import validation
from switchboard.core.admins import (
    ClientJSONField,
    ServiceFormAdmin,
    ServiceModelForm,
    ViewerZoneAdmin,
)
from switchboard.core.errors import DomainError, InvalidArgument
from switchboard.ledger.admin import LedgerEntryAdmin, ReadOnlyAdmin
from switchboard.ledger.models import LedgerEntry


def _actor(request: HttpRequest) -> HumanActor:
    return HumanActor(request.user, via="admin")


WINDOW_COLUMNS = ("window_period", "window_tz", "window_start", "window_weekday")


class AdmissionPolicyForm(ServiceModelForm):
    """Validated by ``PolicySpec.clean``, its field-named errors shown beside the field; saved by
    ``policy_set`` (whose refusals, a rate limit say, land on the form the same way).

    The page carries the version of the budget it showed (``version``, hidden): the save writes
    only over that version, so a change someone made since the page opened is not overwritten
    unseen, and an add does not replace a budget set meanwhile."""

    version = forms.CharField(widget=forms.HiddenInput, required=False)
    extra_windows = ClientJSONField(
        name="extra_windows",
        required=False,
        help_text='Stacked windows after the first, e.g. [{"limit": 1000, "period": "day", '
        '"tz": "Europe/Berlin", "start": "00:00"}]. Every one is charged on each claim.',
    )

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

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        shown = None if self.instance._state.adding else self.instance
        self.fields["version"].initial = selectors.policy_version(shown)

    def _get_validation_exclusions(self) -> set[str]:
        # The window's columns are the service's to check (``PolicySpec.clean``, in ``clean``,
        # naming the field, and defaulting a blank start to 00:00 as every other surface does):
        # the model's constraints over them (``policy_window_complete``) named no field and
        # refused a blank start the service accepts.
        return super()._get_validation_exclusions() | set(WINDOW_COLUMNS)

    def clean_extra_windows(self) -> list[Any]:
        windows = self.cleaned_data.get("extra_windows")
        if windows in (None, ""):
            return []
        if not isinstance(windows, list):
            raise forms.ValidationError(
                "extra_windows must be a JSON list of windows, e.g. [] or "
                '[{"limit": 1000, "period": "day", "tz": "UTC", "start": "00:00"}]'
            )
        # A whole number written 3.0 is 3, as the API reads a window's limit.
        return [validation.integral_numbers(WindowLimitIn, window) for window in windows]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if self.errors:
            return data
        data = self._with_identity(data)
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

    def _with_identity(self, data: dict[str, Any]) -> dict[str, Any]:
        # On a change the identity is read-only (not in the form): take it from the row.
        if not self.instance._state.adding:
            return {**data, "endpoint": self.instance.endpoint, "queue": self.instance.queue}
        return data

    def write(self) -> AdmissionPolicy:
        assert self.request is not None
        data = self._with_identity(self.cleaned_data)
        return services.policy_set(
            actor=_actor(self.request),
            endpoint=data["endpoint"],
            expected=(data.get("version") or "",),
            **service_arguments(data),
        )


def service_arguments(data: dict[str, Any]) -> dict[str, Any]:
    """The policy's arguments from the model form's columns (the identity's queue included)."""
    return {"queue": data.get("queue") or "", **arguments_from_columns(data)}


@admin.register(AdmissionPolicy)
class AdmissionPolicyAdmin(ServiceFormAdmin):
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
    list_filter = [
        "posture",
        "window_period",
        ("endpoint__owner", admin.RelatedOnlyFieldListFilter),
    ]
    search_fields = ["queue", "endpoint__slug", "endpoint__name", "window_tz"]
    list_select_related = ["endpoint", "updated_by"]
    readonly_fields = ["created_by", "created_at", "updated_by", "updated_at"]
    actions = ["clear"]

    @admin.display(description="window")
    def window(self, obj: AdmissionPolicy) -> str:
        return selectors.describe_window(obj) or "—"

    def get_queryset(self, request: HttpRequest) -> QuerySet[AdmissionPolicy]:
        return selectors.visible_policies(_actor(request))

    def formfield_for_foreignkey(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        # The endpoints this human may read (others' names are not theirs to list).
        if db_field.name == "endpoint":
            kwargs["queryset"] = visible_endpoints(_actor(request))
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def get_form(
        self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any
    ) -> Any:
        form = super().get_form(request, obj, change=change, **kwargs)
        field = form.base_fields.get("endpoint")
        if obj is None and field is not None:
            # No budget is set on a revoked endpoint (policy_set refuses it): not offered. One
            # revoked since the page opened is refused beside the field. A change form keeps the
            # endpoint it has (read-only there).
            field.queryset = field.queryset.filter(state=EndpointState.ACTIVE)
            field.error_messages["invalid_choice"] = (
                "Select one of the endpoints offered: a revoked endpoint's budgets can only be "
                "cleared."
            )
        return form

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[Any]:
        # The identity of a budget never changes: clear it and set another.
        fixed = ["endpoint", "queue"] if obj is not None else []
        return [*self.unlinked(request, fixed), *super().get_readonly_fields(request, obj)]

    def save_model(
        self, request: HttpRequest, obj: AdmissionPolicy, form: Any, change: bool
    ) -> None:
        obj.pk = form.written.pk  # saved by the form's validation (ServiceModelForm)
        obj.refresh_from_db()

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        # Django's "delete selected" counts what it asked for as deleted; "clear" counts what was.
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)
        return actions

    def log_deletions(self, request: HttpRequest, queryset: Any) -> list[Any]:
        return []  # the ledger is the record of a budget's removal (written only if it was)

    def render_delete_form(self, request: HttpRequest, context: dict[str, Any]) -> Any:
        # The confirmation carries the version it showed: what is confirmed is that budget.
        context["version"] = selectors.policy_version(context["object"])
        return super().render_delete_form(request, context)

    def delete_model(self, request: HttpRequest, obj: AdmissionPolicy) -> None:
        # A confirmation from before the page carried its version clears whatever is there.
        version = request.POST.get("version")
        try:
            services.policy_clear(
                actor=_actor(request),
                endpoint=obj.endpoint,
                queue=obj.queue,
                expected=(version,) if version else None,
            )
        except DomainError as exc:  # e.g. rate_limited: the budget stays, and the page says so
            request._switchboard_refused = exc.message  # type: ignore[attr-defined]

    def response_delete(self, request: HttpRequest, obj_display: str, obj_id: Any) -> Any:
        refused = getattr(request, "_switchboard_refused", None)
        if refused is None:
            return super().response_delete(request, obj_display, obj_id)
        messages.error(request, f"Not cleared: {refused}")
        return HttpResponseRedirect(
            reverse("admin:admission_admissionpolicy_change", args=[obj_id])
        )

    @admin.action(description="Clear the selected budgets", permissions=["delete"])
    def clear(self, request: HttpRequest, queryset: QuerySet[AdmissionPolicy]) -> None:
        cleared = 0
        for policy in queryset.select_related("endpoint"):
            try:
                services.policy_clear(
                    actor=_actor(request), endpoint=policy.endpoint, queue=policy.queue
                )
                cleared += 1
            except DomainError as exc:
                self.message_user(request, f"{policy}: {exc.message}", level=messages.ERROR)
        self.message_user(request, f"{cleared} budget(s) cleared.")


@admin.register(LedgerEntry)
class VisibleLedgerEntryAdmin(ViewerZoneAdmin, LedgerEntryAdmin):
    """The ledger's rows this human may read (``visible_ledger``: the console's page and CSV,
    the API): every row for auditors and superusers, an owner's own scopes otherwise; its times
    in the viewer's zone (the ledger's admin cannot read the console's cookie itself)."""

    def get_queryset(self, request: HttpRequest) -> QuerySet[LedgerEntry]:
        return selectors.visible_ledger(_actor(request))


@admin.register(AdmissionWindow)
class AdmissionWindowAdmin(ViewerZoneAdmin, ReadOnlyAdmin):
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

    def get_queryset(self, request: HttpRequest) -> QuerySet[AdmissionWindow]:
        # The counters of the budgets this human may read.
        visible = selectors.visible_policies(_actor(request))
        return super().get_queryset(request).filter(policy__in=visible)
