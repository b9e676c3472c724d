"""What every model admin here builds on.

``StrictAdmin``: a crafted changelist or action request (a year past the calendar's range, a
selection whose id is not one) is refused with the admin's own "invalid lookup" page or a message,
not a 500.

``ViewerZoneAdmin``: the page's times in the viewer's zone, the console's (the ``tz`` cookie), not
the server's UTC; the page names the zone (templates/admin/base_site.html).

``ServiceModelForm`` / ``ServiceFormAdmin``: admin forms whose save is a service call. The admin
saves a form after it is valid, in ``ModelAdmin.save_model``, where a refusal has no page to land
on: a ``ValidationError`` raised there is a 500. So the write happens in the form instead, last in
its validation (after the fields, ``clean`` and the model's own checks): the service's refusal
becomes an error beside the field it names (or above the form), and since the service refused,
nothing was written. ``save_model`` only takes what the write made. A range the service checks
(``service_ranges``) is left to it, so a value outside it is refused in the service's words
beside its field, not by the model's constraint above the form.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import transaction
from django.db.models import QuerySet
from django.forms.fields import InvalidJSONInput, JSONString
from django.http import HttpRequest, HttpResponse
from django.http.response import HttpResponseBase
from django.template.response import SimpleTemplateResponse
from django.utils import timezone

from switchboard.core import validation
from switchboard.core.errors import DomainError, InvalidArgument
from switchboard.core.pages import TZ_COOKIE
from switchboard.core.zones import zone_named


class StrictChangeList(ChangeList):
    """A lookup Python cannot turn into a query (``?created_at__year=-1``, a year of 20 digits)
    is the admin's invalid-lookup answer (a redirect to ``?e=1``), as its other bad lookups are."""

    def get_queryset(self, request: HttpRequest, exclude_parameters: Any = None) -> QuerySet[Any]:
        try:
            return super().get_queryset(request, exclude_parameters)
        except (ValueError, OverflowError) as exc:
            raise IncorrectLookupParameters(exc) from exc

    def get_results(self, request: HttpRequest) -> None:
        try:
            super().get_results(request)
        except (ValueError, OverflowError) as exc:
            raise IncorrectLookupParameters(exc) from exc


def _as_text(name: str, label: str) -> Callable[[Any], str]:
    """A read-only field showing the object a foreign key names by its name, not as a link."""

    def shown(obj: Any) -> str:
        value = getattr(obj, name, None)
        return "-" if value is None else str(value)

    shown.__name__ = name  # the row's class (field-owner), as the field's own would be
    shown.short_description = label  # type: ignore[attr-defined]
    return shown


def in_viewer_zone(request: HttpRequest, view: Callable[[], HttpResponseBase]) -> HttpResponseBase:
    """``view``'s answer made and rendered in the viewer's zone (UTC without the cookie), as the
    console's times are, the page naming it (``viewer_zone``, templates/admin/base_site.html).
    Rendered here: a template response renders after the view returns, outside any zone the
    view set, and the admin formats its times as it renders."""
    name, zone = zone_named(request.COOKIES.get(TZ_COOKIE))
    with timezone.override(zone):
        response = view()
        if isinstance(response, SimpleTemplateResponse):
            response.context_data = {**(response.context_data or {}), "viewer_zone": name}
            response.render()
    return response


class ViewerZoneAdmin(admin.ModelAdmin):
    """A model admin whose pages show times in the viewer's zone (``in_viewer_zone``): the list
    (its actions' pages too), the add and change forms, the delete confirmation, the history.

    A read-only foreign key is shown as the admin shows it, a link to what it names, only to a
    viewer who may open that page; to anyone else as its name alone (``_unlinked``): Django
    links it whatever the viewer may see, and an auditor reading an endpoint was one click from
    a 403 on its owner's user page."""

    def __init__(self, model: Any, admin_site: Any) -> None:
        super().__init__(model, admin_site)
        # Each foreign key's plain display, made once: the form leaves out the very object the
        # page shows (requests on other threads share this admin).
        self._shown_as_text = {
            field.name: (field.related_model, _as_text(field.name, str(field.verbose_name)))
            for field in model._meta.get_fields()
            if (field.many_to_one or field.one_to_one) and not field.auto_created
        }

    def _unlinked(self, request: HttpRequest) -> dict[str, Callable[[Any], str]]:
        """The foreign keys whose page this viewer may not open: each with its plain display."""
        unlinked = {}
        for name, (related, shown) in self._shown_as_text.items():
            target = self.admin_site._registry.get(related)
            if target is not None and not target.has_view_or_change_permission(request):
                unlinked[name] = shown
        return unlinked

    def unlinked(self, request: HttpRequest, names: Any) -> list[Any]:
        """Read-only ``names`` with each foreign key this viewer may not open as its name alone
        (an override of ``get_readonly_fields`` passes what it adds through this)."""
        unlinked = self._unlinked(request)
        return [unlinked.get(f, f) if isinstance(f, str) else f for f in names]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return self.unlinked(request, super().get_readonly_fields(request, obj))

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        fieldsets = super().get_fieldsets(request, obj)
        unlinked = self._unlinked(request)
        if not unlinked:
            return fieldsets
        if obj is not None and not self.has_change_permission(request, obj):
            swapped = unlinked  # a page to view: every field read-only, none in the form
        else:
            # Those the form leaves out as read-only: an override of get_readonly_fields that
            # does not call this one's keeps its links (swapped here, the form would want them).
            readonly = self.get_readonly_fields(request, obj)
            swapped = {name: shown for name, shown in unlinked.items() if shown in readonly}

        def swap(names: Any) -> Any:
            if isinstance(names, list | tuple):
                return type(names)(swap(n) for n in names)
            return swapped.get(names, names) if isinstance(names, str) else names

        return [
            (name, {**options, "fields": swap(options["fields"])}) for name, options in fieldsets
        ]

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> Any:
        view = super().changelist_view
        return in_viewer_zone(request, lambda: view(request, extra_context))

    def changeform_view(
        self,
        request: HttpRequest,
        object_id: str | None = None,
        form_url: str = "",
        extra_context: Any = None,
    ) -> Any:
        view = super().changeform_view
        return in_viewer_zone(request, lambda: view(request, object_id, form_url, extra_context))

    def delete_view(self, request: HttpRequest, object_id: str, extra_context: Any = None) -> Any:
        view = super().delete_view
        return in_viewer_zone(request, lambda: view(request, object_id, extra_context))

    def history_view(self, request: HttpRequest, object_id: str, extra_context: Any = None) -> Any:
        view = super().history_view
        return in_viewer_zone(request, lambda: view(request, object_id, extra_context))


class StrictAdmin(ViewerZoneAdmin):
    """The base of every model admin here (see the module's docstring)."""

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return StrictChangeList

    def response_action(
        self, request: HttpRequest, queryset: QuerySet[Any], *args: Any, **kwargs: Any
    ) -> HttpResponse | None:
        # The checkboxes carry real ids; a hand-made POST may not, and the action's query would
        # fail on it. Nothing is done and the list says why.
        pk = self.model._meta.pk
        assert pk is not None
        selected = request.POST.getlist(helpers.ACTION_CHECKBOX_NAME)
        try:
            for value in selected:
                pk.to_python(value)
        except ValidationError:
            self._nothing_done(request)
            return None
        # Nor may it name only rows this list does not hold (another owner's endpoint): the
        # action would run on none of them, and its summary would count nothing done.
        across = request.POST.get("select_across", "0") not in ("0", "", "False", "false")
        if selected and not across and not queryset.filter(pk__in=selected).exists():
            self._nothing_done(request)
            return None
        return super().response_action(request, queryset, *args, **kwargs)

    def _nothing_done(self, request: HttpRequest) -> None:
        self.message_user(
            request, "Nothing done: the selection names no such item.", messages.WARNING
        )


class ClientJSONField(forms.JSONField):
    """An admin form's JSON read as a client's (``validation.loads``, its problems named below
    ``name``): NaN, a number past the digit limit, a lone surrogate, a name given twice or too
    deep are refused beside the field, where Django's ``json.loads`` let some through and
    failed on others with a server error (the digit limit's ``ValueError``; a surrogate shown
    again in the refused form). A refused text is shown again as typed."""

    def __init__(self, *, name: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.name = name

    def to_python(self, value: Any) -> Any:
        if self.disabled or value in self.empty_values or not isinstance(value, str):
            return super().to_python(value)
        try:
            parsed = validation.loads(value, self.name)
        except InvalidArgument as exc:
            raise ValidationError(exc.message, code="invalid") from None
        return JSONString(parsed) if isinstance(parsed, str) else parsed

    def bound_data(self, data: Any, initial: Any) -> Any:
        if self.disabled or data is None or not isinstance(data, str):
            return super().bound_data(data, initial)
        try:
            return validation.loads(data, self.name)
        except InvalidArgument:
            return InvalidJSONInput(data)


class ServiceModelForm(forms.ModelForm):
    """A model form that, once valid, calls ``write`` (its service) in a savepoint and turns a
    ``DomainError`` into the form's error on the field it names."""

    # The services' names of fields that the form calls otherwise (``rps`` for ``rate_limit_rps``).
    service_fields: ClassVar[dict[str, str]] = {}
    # Fields whose range the service checks, refusing what is outside it in its own words and
    # naming the field: (lowest, highest) accepted, which the inputs offer as their min and max.
    # The form's and the model's own checks of them are left out: the model's is a
    # CheckConstraint, whose refusal names no field ("Constraint … is violated." above the form),
    # and the form's bounds are the column's (0), not what the service accepts.
    service_ranges: ClassVar[dict[str, tuple[int, int]]] = {}
    # Fields whose values the service checks, refusing in its words beside the field (as the API
    # does): the model's constraints over them are left out, for the same reason.
    service_checked: ClassVar[frozenset[str]] = frozenset()
    # The admin's request (who acts), set on the class ``ModelAdmin.get_form`` makes for it.
    request: HttpRequest | None = None
    written: Any = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for name, (lowest, highest) in self.service_ranges.items():
            field = self.fields.get(name)
            if field is None:
                continue
            bounds = (MinValueValidator, MaxValueValidator)
            field.validators = [v for v in field.validators if not isinstance(v, bounds)]
            field.widget.attrs.update(min=lowest, max=highest)

    def _get_validation_exclusions(self) -> set[str]:
        # ModelForm's hook (private, unchanged since Django 1.x) for the fields the model's
        # validation leaves out (those the form already refused): the service checks these.
        excluded: set[str] = super()._get_validation_exclusions()  # type: ignore[misc]
        return excluded | set(self.service_ranges) | self.service_checked

    def write(self) -> Any:
        """Make the change through its service; the answer is kept as ``written``."""
        raise NotImplementedError

    def full_clean(self) -> None:
        super().full_clean()
        if not self.is_bound or self.errors:
            return
        try:
            with transaction.atomic():
                self.written = self.write()
        except DomainError as exc:
            name = str(exc.details.get("field") or "")
            name = self.service_fields.get(name, name)
            self.add_error(name if name in self.fields else None, exc.message)


class ServiceFormAdmin(StrictAdmin):
    """A model admin whose forms are ``ServiceModelForm``s: each form class it makes knows the
    request it serves (``get_form`` makes a class per request)."""

    def get_form(
        self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any
    ) -> Any:
        form: Any = super().get_form(request, obj, change=change, **kwargs)
        form.request = request
        return form
