"""The ledger in the admin: read-only for everyone, superusers included. ``ReadOnlyAdmin`` also
serves the other apps' audit tables; ``LedgerEntryAdmin`` is registered by admission/admin.py."""

from __future__ import annotations

from collections.abc import Iterator
from itertools import zip_longest
from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.views.main import ChangeList
from django.http import HttpRequest

from switchboard.ledger.models import LedgerHead

if TYPE_CHECKING:
    from django.contrib.admin.filters import _ListFilterChoices


class _ChangeList(ChangeList):
    def get_queryset(self, request: HttpRequest, exclude_parameters: Any = None) -> Any:
        # Django's date hierarchy turns ?at__year=<20 digits> into an OverflowError and
        # ?at__year=9999 into a ValueError (year 10000 ends it): each a 500, where the admin's
        # invalid-lookup answer is due. (switchboard.core.admins does the same for the apps'
        # admins; the ledger depends on nothing, so it keeps its own.)
        try:
            return super().get_queryset(request, exclude_parameters)
        except (ValueError, OverflowError) as exc:
            raise IncorrectLookupParameters(exc) from exc


class ReadOnlyAdmin(admin.ModelAdmin):
    """Viewable by those with the view permission; never added to, changed or deleted."""

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return _ChangeList

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        return {}


class NamedBlankValuesFilter(admin.AllValuesFieldListFilter):
    """Django's filter by each value in the column, a blank value named "(none)": Django shows
    it as a link with no text (axe: link-name, serious), which no one can read or pick."""

    BLANK = "(none)"

    def choices(self, changelist: ChangeList) -> Iterator[_ListFilterChoices]:
        # The parent's choices: "All", then one per value of lookup_choices but None (whose
        # choice, if any, comes last and is already named).
        values = [None, *(str(v) for v in self.lookup_choices if v is not None)]
        for choice, value in zip_longest(super().choices(changelist), values):
            if value == "":
                choice["display"] = f"{self.BLANK}{choice['display']}"
            yield choice


# Registered by admission/admin.py, which narrows it to the rows the access layer lets the
# viewer read (the ledger depends on no app, so it cannot ask queues.access itself).
class LedgerEntryAdmin(ReadOnlyAdmin):
    list_display = [
        "seq",
        "chain",
        "chain_pos",
        "at",
        "kind",
        "actor_human_name",
        "actor_endpoint_slug",
        "scope",
        "queue",
    ]
    list_filter = ["kind", "chain", ("scope", NamedBlankValuesFilter)]
    search_fields = ["scope", "queue", "actor_human_name", "actor_endpoint_slug", "entry_hash"]
    date_hierarchy = "at"
    ordering = ["-seq"]


@admin.register(LedgerHead)
class LedgerHeadAdmin(ReadOnlyAdmin):
    list_display = ["id", "chain_pos", "seq", "entry_hash"]
