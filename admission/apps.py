from __future__ import annotations

from django.apps import AppConfig


class AdmissionConfig(AppConfig):
    name = "admission"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        import admission.verbs  # noqa: F401  (declares this app's agent verbs)
        from admission import gate
        from admission.audit import PolicyTrail
        from switchboard.ledger import chain

        chain.register_trail(PolicyTrail)
        gate.register()
