from __future__ import annotations

from django.apps import AppConfig


class LimitsConfig(AppConfig):
    """Named limits (pools, tag limits, rate limits, queue settings): declared here, named by
    todos at intake (``queues.declared``)."""

    name = "admission.limits"
    label = "limits"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        import admission.limits.verbs  # noqa: F401  (declares this app's agent verb)
        from admission.limits import gates, intake, priority, rates
        from admission.limits.audit import LimitTrail
        from queues import declared
        from queues import gates as claim_gates
        from switchboard.ledger import chain

        # ledger verify (and limits verify) compare every declaration with its audited state.
        chain.register_trail(LimitTrail)

        declared.register(intake.DECLARATIONS)
        declared.register_rate_observer(rates.observe)
        gates.register()
        claim_gates.register_priority(priority.QueuePriority())
