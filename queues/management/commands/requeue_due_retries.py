from __future__ import annotations

from typing import Any

from django.core.management.base import CommandParser

from queues import services
from switchboard.core.cli import SwitchboardCommand, emit


class Command(SwitchboardCommand):
    help = "Run the requeue_due_retries sweep once (beat runs it every SWEEP_INTERVAL_SECONDS)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="print JSON")

    def handle(self, *args: Any, **options: Any) -> None:
        n = services.requeue_due_retries()
        emit(self, options, {"todos": n}, f"requeue_due_retries: {n} todo(s)")
