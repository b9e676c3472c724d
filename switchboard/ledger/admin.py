"""The ledger in the admin: read-only for everyone, superusers included. ``ReadOnlyAdmin`` also
serves the other apps' audit tables."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from switchboard.ledger.models import LedgerEntry, LedgerHead


class ReadOnlyAdmin(admin.ModelAdmin):
    """Viewable by those with the view permission; never added to, changed or deleted."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        return {}


@admin.register(LedgerEntry)
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
    list_filter = ["kind", "chain", "scope"]
    search_fields = ["scope", "queue", "actor_human_name", "actor_endpoint_slug", "entry_hash"]
    date_hierarchy = "at"
    ordering = ["-seq"]


@admin.register(LedgerHead)
class LedgerHeadAdmin(ReadOnlyAdmin):
    list_display = ["id", "chain_pos", "seq", "entry_hash"]
