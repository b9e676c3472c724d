from __future__ import annotations

from django.apps import AppConfig


class ConsoleConfig(AppConfig):
    """The operations console: the board, the live stream, queue and todo pages, /metrics."""

    name = "switchboard.console"
    label = "console"

    def ready(self) -> None:
        from prometheus_client import REGISTRY

        from switchboard.console.collectors import SwitchboardCollector

        if not getattr(REGISTRY, "_switchboard_registered", False):
            REGISTRY.register(SwitchboardCollector())
            REGISTRY._switchboard_registered = True  # type: ignore[attr-defined]
