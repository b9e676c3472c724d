from __future__ import annotations

from typing import Any

from django.core.management.base import CommandParser

from admission import services
from switchboard.core.cli import SwitchboardCommand, emit


class Command(SwitchboardCommand):
    help = (
        "Run the admission reopen sweep once (beat runs it every SWEEP_INTERVAL_SECONDS): one "
        "todo_ready per budgeted queue that became admitted and has work."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="print JSON")

    def handle(self, *args: Any, **options: Any) -> None:
        result = services.reopen_sweep()
        rung = ", ".join(result.rung) or "none"
        emit(
            self,
            options,
            result.as_dict(),
            f"admission_reopen: {result.policies} policies; rang {rung}",
        )
