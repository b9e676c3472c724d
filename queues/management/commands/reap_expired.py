from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from queues import services


class Command(BaseCommand):
    help = "Run the reap_expired sweep once (beat runs it every SWEEP_INTERVAL_SECONDS)."

    def handle(self, *args: Any, **options: Any) -> None:
        n = services.reap_expired()
        self.stdout.write(f"reap_expired: {n} todo(s)")
