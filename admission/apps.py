from __future__ import annotations

from django.apps import AppConfig


class AdmissionConfig(AppConfig):
    name = "admission"
    default_auto_field = "django.db.models.BigAutoField"
