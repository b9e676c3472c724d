from __future__ import annotations

from django.apps import AppConfig


class QueuesConfig(AppConfig):
    name = "queues"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from prometheus_client import REGISTRY

        from queues.collectors import SwitchboardCollector

        if not getattr(REGISTRY, "_switchboard_registered", False):
            REGISTRY.register(SwitchboardCollector())
            REGISTRY._switchboard_registered = True  # type: ignore[attr-defined]
