from __future__ import annotations

from django.apps import AppConfig


class QueuesConfig(AppConfig):
    name = "queues"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from psycopg.types.json import set_json_loads

        import queues.agent_verbs  # noqa: F401  (declares this app's agent verbs)
        import switchboard.core.deploy_checks  # noqa: F401  (registers check --deploy's checks)
        from switchboard.core.validation import stored_json_loads

        # The claim statements read jsonb through psycopg's own loader: make it one that never
        # raises, so a row too deep for Python's parser cannot fail a committed claim.
        set_json_loads(stored_json_loads)
