from __future__ import annotations

from django.apps import AppConfig


class LimitsConfig(AppConfig):
    """Named limits (pools, tag limits, rate limits, queue settings): declared here, named by
    todos at intake (``queues.declared``)."""

    name = "admission.limits"
    label = "limits"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from admission.limits import gates, intake
        from queues import declared

        declared.register(intake.check_declared)
        gates.register()
