from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import CommandParser

from admission import services
from switchboard.core.cli import SwitchboardCommand, emit


class Command(SwitchboardCommand):
    help = "Prune admission window counters older than WINDOW_RETENTION_DAYS (beat: hourly)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="print JSON")

    def handle(self, *args: Any, **options: Any) -> None:
        n = services.window_retention()
        emit(
            self,
            options,
            {"deleted": n, "retention_days": settings.WINDOW_RETENTION_DAYS},
            f"admission_retention: {n} window(s) older than {settings.WINDOW_RETENTION_DAYS} days",
        )
