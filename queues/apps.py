from __future__ import annotations

from django.apps import AppConfig


class QueuesConfig(AppConfig):
    name = "queues"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        import queues.agent_verbs  # noqa: F401  (declares this app's agent verbs)
