"""The admin: endpoints (vend shows the token once), todos (retry, release), attempts (read-only),
pauses and personal tokens. Every write goes through the services (``queues.services`` and
``queues.pauses``), so each lands in the ledger; nothing here deletes a todo or a token. An action
is offered only to those who may take it (Django's permission, and never to an auditor), and its
summary counts what was done, each refusal a warning of its own."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.views.main import ChangeList
from django.contrib.auth import admin as auth_admin
from django.contrib.auth import get_permission_codename, get_user_model
from django.db import models
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import formats, timezone
from django.utils.html import format_html_join

from queues import access, pauses, selectors, services
from queues.access import HumanActor
from queues.gates import GateState
from queues.models import (
    BASIC_VERBS,
    GRANTABLE_VERBS,
    MAX_BURST,
    Attempt,
    Endpoint,
    EndpointState,
    HumanToken,
    QueuePause,
    Todo,
    TodoState,
    check_queue_name,
)
from switchboard.core import versions
from switchboard.core.admins import (
    ServiceFormAdmin,
    ServiceModelForm,
    StrictAdmin,
    StrictChangeList,
    ViewerZoneAdmin,
)
from switchboard.core.errors import DomainError, InvalidArgument, NotFound
from switchboard.core.pages import isolated

# The services' names for the endpoint's fields where the model's differ.
ENDPOINT_SERVICE_FIELDS = {
    "lease_ttl": "default_lease_ttl_seconds",
    "rps": "rate_limit_rps",
    "burst": "rate_limit_burst",
}

# The change form's fields -> ``endpoint_update``'s arguments.
ENDPOINT_UPDATE_ARGUMENTS = {
    "name": "name",
    "owner": "owner",
    "notify_url": "notify_url",
    "default_lease_ttl_seconds": "lease_ttl_seconds",
    "rate_limit_rps": "rps",
    "rate_limit_burst": "burst",
}

# The ranges endpoint_vend and endpoint_update accept (the rest they refuse, naming the field).
ENDPOINT_RANGES = {
    "default_lease_ttl_seconds": (1, 86400),
    "rate_limit_rps": (0, 100000),
    "rate_limit_burst": (1, MAX_BURST),
}


class EndpointVendForm(ServiceModelForm):
    """The vend form: scope is chosen once; tokens are generated, never typed."""

    service_fields = ENDPOINT_SERVICE_FIELDS
    service_ranges = ENDPOINT_RANGES
    notify_url = forms.URLField(required=False, assume_scheme="https")

    queues = forms.CharField(help_text="Comma-separated queue names this endpoint may drain.")
    verbs = forms.MultipleChoiceField(
        choices=[(v, v) for v in GRANTABLE_VERBS],
        initial=list(BASIC_VERBS),
        widget=forms.CheckboxSelectMultiple,
        help_text="set_admission_policy / clear_admission_policy let the agent change its own "
        "budget; they are never part of the basic grant.",
    )

    class Meta:
        model = Endpoint
        fields = [
            "name",
            "owner",
            "default_lease_ttl_seconds",
            "rate_limit_rps",
            "rate_limit_burst",
            "notify_url",
        ]

    def clean_queues(self) -> list[str]:
        names = [q.strip() for q in self.cleaned_data["queues"].split(",") if q.strip()]
        if not names:
            raise forms.ValidationError("name at least one queue")
        for name in names:
            try:
                check_queue_name(name, field_name="queues")
            except DomainError as exc:
                raise forms.ValidationError(exc.message) from exc
        return names

    def write(self) -> tuple[Endpoint, str]:
        assert self.request is not None
        data = self.cleaned_data
        return services.endpoint_vend(
            actor=_actor(self.request),
            owner=data["owner"],
            name=data["name"],
            queues=data["queues"],
            verbs=list(data["verbs"]),
            lease_ttl_seconds=data.get("default_lease_ttl_seconds"),
            rps=data.get("rate_limit_rps"),
            burst=data.get("rate_limit_burst"),
            notify_url=data.get("notify_url") or "",
        )


class EndpointChangeForm(ServiceModelForm):
    """What may change after vend, changed through ``endpoint_update`` (its ledger row, a hook
    URL's signing secret); scope never widens here.

    The page carries the version of the endpoint it showed (``version``, hidden; as a budget's
    form does): the save writes only over that version, so a change someone made since the page
    opened is not put back unseen by a form that still shows the old values."""

    service_fields = ENDPOINT_SERVICE_FIELDS
    service_ranges = ENDPOINT_RANGES
    notify_url = forms.URLField(required=False, assume_scheme="https")
    version = forms.CharField(widget=forms.HiddenInput, required=False)

    class Meta:
        model = Endpoint
        fields = list(ENDPOINT_UPDATE_ARGUMENTS)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["version"].initial = selectors.endpoint_version(self.instance)
        # The secret before this save (save_model shows a new one once).
        self.initial_secret = self.instance.notify_secret

    def write(self) -> Endpoint:
        assert self.request is not None
        data = self.cleaned_data
        # A form without a version (made before pages carried one) writes as before.
        return services.endpoint_update(
            endpoint=Endpoint.objects.get(pk=self.instance.pk),
            actor=_actor(self.request),
            expected=versions.named(data.get("version") or None),
            **{
                arg: data[name]
                for name, arg in ENDPOINT_UPDATE_ARGUMENTS.items()
                if name in self.changed_data
            },
        )


class AttemptInline(admin.TabularInline):
    model = Attempt
    # A read-only table with a header on every column (Django's tabular form leaves two blank).
    template = "admin/queues/todo/attempts_inline.html"
    extra = 0
    can_delete = False
    fields = ("number", "claimant", "via", "claimed_at", "lease_expires_at", "ended_at", "outcome")
    readonly_fields = (
        "number",
        "claimant",
        "via",
        "claimed_at",
        "lease_expires_at",
        "ended_at",
        "outcome",
    )

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class _PersonFieldAdmin(ServiceFormAdmin):
    """An admin whose form names a person (an endpoint's owner, a token's user): it offers
    everyone to a superuser, who alone acts for others, and only the human at the admin to anyone
    else (the services refuse anyone else, and other users' names are not theirs to list)."""

    person_field = ""

    def formfield_for_foreignkey(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        if db_field.name == self.person_field:
            people = db_field.remote_field.model._default_manager
            kwargs["queryset"] = people.filter(access.people_q(_actor(request)))
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def get_form(
        self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any
    ) -> Any:
        form = super().get_form(request, obj, change=change, **kwargs)
        field = form.base_fields.get(self.person_field)
        if obj is None and field is not None:
            # Nothing new is made for a deactivated person (the service refuses it beside the
            # field): not offered. A change form keeps the person it has.
            field.queryset = field.queryset.filter(is_active=True)
        return form


@admin.register(Endpoint)
class EndpointAdmin(_PersonFieldAdmin):
    person_field = "owner"
    formfield_overrides = {models.URLField: {"assume_scheme": "https"}}
    list_display = ["slug", "name", "owner", "state", "scope_queues", "last_seen_at", "created_at"]
    # Related filters list only what the (access-narrowed) list holds: not every owner's name.
    list_filter = ["state", ("owner", admin.RelatedOnlyFieldListFilter)]
    search_fields = ["slug", "name", "owner__username"]
    readonly_fields = [
        "slug",
        "token_prefix",
        "scope_queues",
        "scope_verbs",
        "state",
        "last_seen_at",
        "created_at",
        "revoked_at",
        "hook_failed_at",
        "hook_error",
    ]
    fields = [
        "slug",
        "name",
        "owner",
        "token_prefix",
        "scope_queues",
        "scope_verbs",
        "state",
        "default_lease_ttl_seconds",
        "rate_limit_rps",
        "rate_limit_burst",
        "notify_url",
        "hook_failed_at",
        "hook_error",
        "last_seen_at",
        "created_at",
        "revoked_at",
        "version",
    ]
    actions = ["revoke", "rotate_hook_secret"]

    def has_revoke_permission(self, request: HttpRequest) -> bool:
        # Revoking changes the endpoint: Django's change permission, never an auditor's.
        return self.has_change_permission(request) and _actor(request).writes

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Revoke instead: deleting would cascade to todos and budgets without a ledger row.
        return False

    def get_queryset(self, request: HttpRequest) -> QuerySet[Endpoint]:
        # The access layer's answer, as on every other surface: owners their own endpoints.
        return access.visible_endpoints(_actor(request))

    def get_form(
        self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any
    ) -> Any:
        if obj is None:
            kwargs["form"] = EndpointVendForm
            kwargs["fields"] = None
        else:
            kwargs["form"] = EndpointChangeForm
        return super().get_form(request, obj, change=change, **kwargs)

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is None:
            return [
                "name",
                "owner",
                "queues",
                "verbs",
                "default_lease_ttl_seconds",
                "rate_limit_rps",
                "rate_limit_burst",
                "notify_url",
            ]
        if not self.has_change_permission(request, obj):
            # A page shown read-only saves nothing: no version to carry. Nor the whole hook URL,
            # which may carry the receiver's secret: where hooks go, as the API shows it.
            return [
                "hook_url" if name == "notify_url" else name
                for name in self.fields
                if name != "version"
            ]
        return self.fields

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return [] if obj is None else [*super().get_readonly_fields(request, obj), "hook_url"]

    @admin.display(description="Hook URL")
    def hook_url(self, obj: Endpoint) -> str:
        """Where ready hooks go (``Endpoint.hook_origin``): scheme, host and port, the rest
        ``/…``."""
        return obj.hook_origin or "-"

    def save_model(self, request: HttpRequest, obj: Endpoint, form: Any, change: bool) -> None:
        # The form's validation made the change through the services (ServiceModelForm).
        if change:
            # A hook URL set where there was none made a signing secret: the receiver needs it,
            # and only this page can say it (the change list's rotation makes a new one).
            written: Endpoint = form.written
            if services.hook_secret_made(form.initial_secret, written):
                _show_hook_secret(request, written)
            return
        endpoint, token = form.written
        obj.pk = endpoint.pk
        obj.slug = endpoint.slug
        # Shown once: only the hash is stored.
        messages.warning(
            request,
            f"Endpoint {endpoint.slug} vended. Its token, shown only now: {token}",
        )
        if endpoint.notify_secret:
            _show_hook_secret(request, endpoint)

    def response_add(
        self, request: HttpRequest, obj: Endpoint, post_url_continue: Any = None
    ) -> HttpResponse:
        return HttpResponseRedirect(reverse("admin:queues_endpoint_change", args=[obj.pk]))

    @admin.action(description="Revoke (dead-letters their live todos)", permissions=["revoke"])
    def revoke(self, request: HttpRequest, queryset: QuerySet[Endpoint]) -> HttpResponse | None:
        """Asks first, as Django's delete does: a revoke cannot be undone and dead-letters the
        endpoints' live todos, so the page names them with the count each would lose. A selection
        with nothing active left to revoke goes straight to the summary."""
        if request.POST.get("post") != "yes":
            asked = self._revoke_confirmation(request, queryset)
            if asked is not None:
                return asked
        revoked, dead, refused = 0, 0, []
        for endpoint in queryset:
            if endpoint.state != EndpointState.ACTIVE:
                refused.append(f"{endpoint.slug}: already revoked")
                continue
            try:
                count = services.endpoint_revoke(endpoint=endpoint, actor=_actor(request))
            except DomainError as exc:
                refused.append(f"{endpoint.slug}: {exc.message}")
                continue
            # endpoint_revoke answers 0 for one revoked meanwhile, and marks only one it revoked.
            if endpoint.state != EndpointState.REVOKED:
                refused.append(f"{endpoint.slug}: already revoked")
                continue
            revoked, dead = revoked + 1, dead + count
        summary = f"{revoked} endpoint(s) revoked"
        if revoked:
            summary += f"; {dead} live todo(s) dead-lettered"
        _summarize(self, request, f"{summary}.", refused)
        return None

    def has_rotate_hook_secret_permission(self, request: HttpRequest) -> bool:
        return self.has_revoke_permission(request)

    @admin.action(
        description="Rotate hook secret (the old one signs beside it for a while)",
        permissions=["rotate_hook_secret"],
    )
    def rotate_hook_secret(self, request: HttpRequest, queryset: QuerySet[Endpoint]) -> None:
        """A new signing secret for each selected endpoint's hooks, shown once; the old one
        still signs for ``HOOK_SECRET_OVERLAP_SECONDS`` (``endpoint_rotate_hook_secret``)."""
        rotated, refused = [], []
        for endpoint in queryset.order_by("slug"):
            try:
                services.endpoint_rotate_hook_secret(endpoint=endpoint, actor=_actor(request))
            except DomainError as exc:
                refused.append(f"{endpoint.slug}: {exc.message}")
                continue
            rotated.append(endpoint)
        _summarize(self, request, f"{len(rotated)} hook secret(s) rotated.", refused)
        for endpoint in rotated:
            _show_hook_secret(request, endpoint)

    def _revoke_confirmation(
        self, request: HttpRequest, queryset: QuerySet[Endpoint]
    ) -> TemplateResponse | None:
        endpoints = list(queryset.select_related("owner").order_by("slug"))
        active = [e for e in endpoints if e.state == EndpointState.ACTIVE]
        if not active:
            return None
        live = selectors.live_todo_counts(e.pk for e in active)
        return TemplateResponse(
            request,
            "admin/queues/endpoint/revoke_confirmation.html",
            {
                **self.admin_site.each_context(request),
                "title": "Revoke these endpoints?",
                "opts": self.model._meta,
                "media": self.media,
                "queryset": endpoints,
                "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
                "to_revoke": [
                    {
                        "endpoint": e,
                        "owner": e.owner.get_username() if e.owner_id else "",
                        "live": live.get(e.pk, 0),
                    }
                    for e in active
                ],
                "left_alone": [e for e in endpoints if e.state != EndpointState.ACTIVE],
            },
        )


# Where todo_explain's answer for a todo shown is kept, read once per todo (TodoChangeList).
_EXPLAINED = "_switchboard_explained"


def _explained(todo: Todo) -> selectors.Explanation | None:
    """Why the pending todo waits (``selectors.todo_explain``, the console's todo page's read);
    None for a todo in another state."""
    if not hasattr(todo, _EXPLAINED):
        setattr(todo, _EXPLAINED, selectors.todo_explain(todo))
    found: selectors.Explanation | None = getattr(todo, _EXPLAINED)
    return found


def _when(at: datetime) -> str:
    """A time as the admin shows its others: the page's zone (the viewer's, named atop it)."""
    return formats.localize(timezone.localtime(at))


def _eligible(gate: GateState) -> str:
    """When a holding gate lets the todo pass, as the console's todo page says it."""
    if gate.next_eligible_at is None:
        return "when an operator acts"
    return f"{'' if gate.exact else '≈ '}{_when(gate.next_eligible_at)}"


def _words(value: str | None) -> str:
    return (value or "").replace("_", " ")


class TodoChangeList(StrictChangeList):
    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        # Each group of todos that wait alike is read once (a page of a hundred pending todos
        # read every gate a hundred times: three queries a todo).
        explained = selectors.todos_explained(self.result_list)
        for todo in self.result_list:
            setattr(todo, _EXPLAINED, explained[todo.id])


@admin.register(Todo)
class TodoAdmin(StrictAdmin):
    """Todos, read-only; each says what it waits on and when it may run, from the same read as
    the console's todo page (``selectors.todo_explain``: every gate, and the one that binds)."""

    list_display = [
        "title",
        "queue",
        "endpoint",
        "state",
        "waiting_on",
        "runs_at",
        "attempt",
        "max_attempts",
        "owner",
        "created_at",
    ]
    list_filter = ["state", "queue", ("endpoint", admin.RelatedOnlyFieldListFilter), "source"]
    search_fields = ["title", "idempotency_key", "id"]
    date_hierarchy = "created_at"
    inlines = [AttemptInline]
    readonly_fields = [
        "id",
        "endpoint",
        "queue",
        "state",
        "waiting_on",
        "runs_at",
        "gates",
        "owner",
        "lease_expires_at",
        "attempt",
        "next_retry_at",
        "result",
        "source",
        "created_at",
        "updated_at",
        "claimed_at",
        "finished_at",
    ]
    actions = ["retry", "release"]

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return TodoChangeList

    @admin.display(description="Waiting on")
    def waiting_on(self, todo: Todo) -> str:
        """The gate that holds a pending todo (its reason), or a failed todo's retry delay."""
        explanation = _explained(todo)
        if explanation is not None:
            gate = explanation.binding
            if gate is None:
                return "nothing: a claim would pass now"
            return (
                f"{_words(gate.gate)} ({_words(gate.reason)})" if gate.reason else _words(gate.gate)
            )
        if todo.state == TodoState.FAILED and todo.next_retry_at is not None:
            return "its retry delay"
        return "—"

    @admin.display(description="Runs at")
    def runs_at(self, todo: Todo) -> str:
        """When a claim may take it: now, when the binding gate lets it pass, or its retry."""
        explanation = _explained(todo)
        if explanation is not None:
            gate = explanation.binding
            return "now" if gate is None else _eligible(gate)
        if todo.state == TodoState.FAILED and todo.next_retry_at is not None:
            return _when(todo.next_retry_at)
        return "—"

    @admin.display(description="Gates")
    def gates(self, todo: Todo) -> str:
        """Every gate a pending todo is subject to, as the console's todo page lists them."""
        explanation = _explained(todo)
        if explanation is None:
            return "—"
        lines = []
        for gate in explanation.gates:
            line = f"{_words(gate.gate)}: {gate.state}"
            if gate.reason:
                line += f" ({_words(gate.reason)})"
            if gate.holds:
                line += f", eligible {_eligible(gate)}"
            lines.append((line, gate.detail))
        # A line each (a list would be indented past the field by the admin's form style).
        return format_html_join("", '<div class="gate">{} — {}</div>', lines)

    def has_act_permission(self, request: HttpRequest) -> bool:
        # Retry and release change a todo: Django's change permission for todos (the form is
        # read-only for everyone, has_change_permission below), never an auditor's.
        return _holds(request, self.opts, "change") and _actor(request).writes

    def get_queryset(self, request: HttpRequest) -> QuerySet[Todo]:
        # The todos the access layer lets this human read (owners: their endpoints').
        return super().get_queryset(request).filter(access.todo_scope(_actor(request)))

    def has_add_permission(self, request: HttpRequest) -> bool:
        # A todo is made by its endpoint's push (the API, MCP, the CLI) through the services: they
        # give it its endpoint, queue, ledger entry and counters, none of which this form has.
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Todos change state only through the services (actions here, the API, the board).
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # A todo's history (attempts, the ledger's waivers) outlives it: never deleted here.
        return False

    @admin.action(
        description="Retry (failed → pending, a fresh round of attempts)", permissions=["act"]
    )
    def retry(self, request: HttpRequest, queryset: QuerySet[Todo]) -> None:
        self._each(request, queryset, services.todo_retry, "retried")

    @admin.action(description="Release (claimed → pending)", permissions=["act"])
    def release(self, request: HttpRequest, queryset: QuerySet[Todo]) -> None:
        self._each(request, queryset, services.todo_release, "released")

    def _each(self, request: HttpRequest, queryset: QuerySet[Todo], fn: Any, verb: str) -> None:
        # A todo in another state is the service's to refuse (its words say which it takes).
        actor = _actor(request)
        done, refused = 0, []
        for todo in queryset:
            try:
                fn(actor=actor, todo_id=todo.id)
                done += 1
            except DomainError as exc:
                refused.append(f"{isolated(todo.title)}: {exc.message}")
        _summarize(self, request, f"{done} todo(s) {verb}.", refused)


@admin.register(Attempt)
class AttemptAdmin(StrictAdmin):
    list_display = [
        "todo",
        "number",
        "endpoint",
        "claimant",
        "via",
        "claimed_at",
        "outcome",
        "disposition",
    ]
    list_filter = ["outcome", "disposition", "via"]
    search_fields = ["claimant", "todo__title", "todo__id"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Attempt]:
        # The attempts of the todos this human may read.
        return (
            super()
            .get_queryset(request)
            .filter(access.endpoint_q(_actor(request), "todo__endpoint"))
        )

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class QueuePauseForm(ServiceModelForm):
    """Pause a queue: the name, a reason, and whether a name nothing has used may be paused.

    The name and the reason are the service's to check (``service_checked``): a name it refuses,
    a reason too long, are refused beside their field in its words, as the API says them, not by
    the model's constraints above the form."""

    service_checked = frozenset({"queue", "reason"})
    create = forms.BooleanField(
        label="Create",
        required=False,
        help_text="Pause a queue name nothing has used yet (guards against typos).",
    )

    class Meta:
        model = QueuePause
        fields = ["queue", "reason"]

    def write(self) -> Any:
        assert self.request is not None
        data = self.cleaned_data
        queue = data.get("queue", "")
        try:
            return pauses.queue_pause(
                actor=HumanActor(self.request.user, via="admin"),
                queue=queue,
                reason=data.get("reason", ""),
                create=bool(data.get("create")),
            )
        except NotFound as exc:
            if exc.details.get("queue") != queue:
                raise
            # A name nothing has used: the service's words name the API's and the CLI's way to
            # pause it anyway; this form's way is its own box.
            raise InvalidArgument(
                f"no queue named {queue!r} is known; to pause it anyway, tick "
                f"“{self.fields['create'].label}”",
                field="queue",
            ) from exc

    def validate_unique(self) -> None:
        # Pausing a paused queue is not an error: the service answers that nothing changed.
        return


@admin.register(QueuePause)
class QueuePauseAdmin(ServiceFormAdmin):
    """Pause through the add form, resume through the action: both call queues/pauses.py, so
    each lands in the ledger. Rows are never edited or deleted here."""

    form = QueuePauseForm
    list_display = ["queue", "reason", "paused_by", "paused_at"]
    search_fields = ["queue", "reason"]
    readonly_fields = ["paused_by", "paused_at"]
    actions = ["resume"]

    def _may_pause(self, request: HttpRequest) -> bool:
        return access.can_pause(_actor(request))

    def has_add_permission(self, request: HttpRequest) -> bool:
        return self._may_pause(request)

    def has_resume_permission(self, request: HttpRequest) -> bool:
        return self._may_pause(request)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def save_model(self, request: HttpRequest, obj: QueuePause, form: Any, change: bool) -> None:
        result = form.written  # paused by the form's validation (ServiceModelForm)
        obj.pk = result.queue if hasattr(result, "queue") else obj.queue
        if not getattr(result, "changed", True):
            messages.info(request, f"Queue {obj.pk} was already paused; nothing changed.")
            request._switchboard_unchanged = True  # type: ignore[attr-defined]

    def message_user(self, request: HttpRequest, message: Any, *args: Any, **kwargs: Any) -> None:
        # An add that found the queue paused added nothing: save_model said so, and the add's
        # own "was added successfully" (response_add) would say the opposite.
        if getattr(request, "_switchboard_unchanged", False):
            return
        super().message_user(request, message, *args, **kwargs)

    def log_addition(self, request: HttpRequest, obj: Any, message: Any) -> Any:
        return None  # the ledger is the record of pauses

    @admin.action(
        description="Resume the selected queues (wakes their backlog once)",
        permissions=["resume"],
    )
    def resume(self, request: HttpRequest, queryset: QuerySet[QueuePause]) -> None:
        resumed, refused = [], []
        for pause in queryset:
            try:
                result = pauses.queue_resume(actor=_actor(request), queue=pause.queue)
            except DomainError as exc:
                refused.append(f"{pause.queue}: {exc.message}")
                continue
            if result.lifted is None:
                refused.append(f"{pause.queue}: already resumed")
            else:
                resumed.append(pause.queue)
        named = f": {', '.join(resumed)}" if resumed else ""
        _summarize(self, request, f"{len(resumed)} queue(s) resumed{named}.", refused)


class HumanTokenForm(ServiceModelForm):
    """A personal token for a user, made by ``human_token_create`` (shown once, then a hash)."""

    class Meta:
        model = HumanToken
        fields = ["user", "name"]

    def write(self) -> tuple[HumanToken, str]:
        assert self.request is not None
        return services.human_token_create(
            user=self.cleaned_data["user"],
            name=self.cleaned_data.get("name") or "",
            actor=_actor(self.request),
        )


@admin.register(HumanToken)
class HumanTokenAdmin(_PersonFieldAdmin):
    form = HumanTokenForm
    person_field = "user"
    list_display = ["token_prefix", "name", "user", "created_at", "last_used_at", "revoked_at"]
    list_filter = ["revoked_at"]
    search_fields = ["name", "user__username", "token_prefix"]
    readonly_fields = ["token_prefix", "created_at", "last_used_at", "revoked_at"]
    fields = ["user", "name", "token_prefix", "created_at", "last_used_at", "revoked_at"]
    actions = ["revoke"]

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # A token is created and revoked, never edited (nor given to another user).
        return False

    def has_revoke_permission(self, request: HttpRequest) -> bool:
        # Revoking changes the token: Django's change permission for tokens (though the form
        # is read-only for everyone, above), never an auditor's.
        return _holds(request, self.opts, "change") and _actor(request).writes

    def get_queryset(self, request: HttpRequest) -> QuerySet[HumanToken]:
        return super().get_queryset(request).filter(access.token_q(_actor(request)))

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Revoke instead: the ledger keeps the create and the revoke.
        return False

    def save_model(self, request: HttpRequest, obj: HumanToken, form: Any, change: bool) -> None:
        token_obj, token = form.written  # made by the form's validation (ServiceModelForm)
        obj.pk = token_obj.pk
        messages.warning(request, f"Personal access token created; shown only now: {token}")

    @admin.action(description="Revoke", permissions=["revoke"])
    def revoke(self, request: HttpRequest, queryset: QuerySet[HumanToken]) -> None:
        n, refused = 0, []
        for token in queryset:
            try:
                revoked = services.human_token_revoke(token=token, actor=_actor(request))
            except DomainError as exc:
                refused.append(f"{token}: {exc.message}")
                continue
            if revoked:
                n += 1
            else:
                refused.append(f"{token}: already revoked")
        _summarize(self, request, f"{n} token(s) revoked.", refused)


# Django's own user pages (a last login, a date joined) show their times in the viewer's zone too,
# as every other page here does.
admin.site.unregister(get_user_model())


@admin.register(get_user_model())
class UserAdmin(ViewerZoneAdmin, auth_admin.UserAdmin):
    # When someone last signed in and joined are facts the server records, not values to type:
    # shown, not offered as Django's split date and time inputs (whose second input has no label
    # a screen reader can read: axe "label", critical).
    readonly_fields = ("last_login", "date_joined")


def _show_hook_secret(request: HttpRequest, endpoint: Endpoint) -> None:
    """The endpoint's hook signing secret, shown once (it is stored to sign, but no page shows
    it again), with how long a rotated-out one still signs."""
    text = f"Endpoint {endpoint.slug}: its hook signing secret, shown only now: "
    text += endpoint.notify_secret
    if endpoint.notify_secret_previous and endpoint.notify_secret_previous_until:
        until = endpoint.notify_secret_previous_until.astimezone(UTC)
        text += f" (the previous one also signs until {until:%Y-%m-%d %H:%M} UTC)"
    messages.warning(request, text)


def _holds(request: HttpRequest, opts: Any, action: str) -> bool:
    """Whether the admin's user holds Django's ``action`` permission on the model."""
    return request.user.has_perm(f"{opts.app_label}.{get_permission_codename(action, opts)}")


def _summarize(
    model_admin: admin.ModelAdmin[Any], request: HttpRequest, done: str, refused: list[str]
) -> None:
    """An action's answer: what it did (a count of what was done, never of what was asked),
    then each item it left alone and why, as a warning of its own."""
    model_admin.message_user(request, done)
    for line in refused:
        # "Left alone:" first: the admin capitalises a message's first letter, which would
        # misspell a slug or a token's prefix that began it ("Sbh_pYT6…").
        model_admin.message_user(request, f"Left alone: {line}", level=messages.WARNING)


def _actor(request: HttpRequest) -> HumanActor:
    """The admin's user as the acting human (roles looked up once per request)."""
    cached = getattr(request, "_switchboard_actor", None)
    if cached is None:
        cached = HumanActor(request.user, via="admin")
        request._switchboard_actor = cached  # type: ignore[attr-defined]
    return cached
