from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from queues import services


class Command(BaseCommand):
    help = "Run the requeue_due_retries sweep once (beat runs it every SWEEP_INTERVAL_SECONDS)."

    def handle(self, *args: Any, **options: Any) -> None:
        n = services.requeue_due_retries()
        self.stdout.write(f"requeue_due_retries: {n} todo(s)")
