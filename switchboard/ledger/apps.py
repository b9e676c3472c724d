from __future__ import annotations

from django.apps import AppConfig


class LedgerConfig(AppConfig):
    name = "switchboard.ledger"
    label = "ledger"
    default_auto_field = "django.db.models.BigAutoField"
