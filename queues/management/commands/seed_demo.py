"""Seed demo data on first run only: an operator login, two endpoints and a few queues of todos.

Credentials are printed once, on the run that creates them. Later runs change nothing.
"""

from __future__ import annotations

import secrets
from typing import Any

from django.contrib.auth.models import Group, User
from django.core.management.base import BaseCommand, CommandParser
from django.db import transaction

from queues import services
from queues.access import AUDITORS_GROUP, HumanActor, SystemActor
from queues.models import Endpoint, TodoSource

OPERATOR = "operator"
AUDITOR = "auditor"

DEMO_TODOS = {
    "inbox": [
        "Triage the overnight support tickets",
        "Summarise yesterday's incident channel",
        "Draft replies for the billing questions",
        "Label the new bug reports",
    ],
    "research": [
        "Compare three vector databases for the search rewrite",
        "Read the new rate-limit RFC and list what changes for us",
    ],
    "deploys": [
        "Roll the canary for the API gateway",
        "Check the migration plan for the orders table",
    ],
}


class Command(BaseCommand):
    help = "Create demo data (an operator, an auditor, two endpoints, todos) if none exists."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--force", action="store_true", help="seed even if users exist")

    def handle(self, *args: Any, **options: Any) -> None:
        if User.objects.exists() and not options["force"]:
            self.stdout.write("Demo data: already seeded (logins were printed on the first run).")
            return
        password = secrets.token_urlsafe(12)
        auditor_password = secrets.token_urlsafe(12)
        with transaction.atomic():
            operator = User.objects.create_superuser(OPERATOR, password=password)
            # The group and its view permissions come from a migration.
            auditors, _ = Group.objects.get_or_create(name=AUDITORS_GROUP)
            auditor = User.objects.create_user(AUDITOR, password=auditor_password, is_staff=True)
            auditor.groups.add(auditors)
            triage, triage_token = services.endpoint_vend(
                owner=operator,
                name="Triage agent",
                queues=["inbox", "research"],
                slug="triage",
                actor=SystemActor(via="seed"),
            )
            deployer, deployer_token = services.endpoint_vend(
                owner=operator,
                name="Deploy agent",
                queues=["deploys", "inbox"],
                slug="deployer",
                actor=SystemActor(via="seed"),
            )
            actor = HumanActor(operator, via="cli")
            for endpoint in (triage, deployer):
                for queue, titles in DEMO_TODOS.items():
                    if queue not in endpoint.scope_queues:
                        continue
                    for title in titles:
                        services.todo_create(
                            actor=actor,
                            endpoint=endpoint,
                            queue=queue,
                            title=title,
                            source=TodoSource.DEMO,
                        )
        self._banner(
            password, auditor_password, [(triage, triage_token), (deployer, deployer_token)]
        )

    def _banner(
        self, password: str, auditor_password: str, endpoints: list[tuple[Endpoint, str]]
    ) -> None:
        from django.conf import settings

        lines = [
            "",
            "=" * 72,
            "First run: demo data created. These secrets are shown once; keep them.",
            f"Demo login: {OPERATOR} / {password}   (superuser; /admin/ and the board)",
            f"Auditor login: {AUDITOR} / {auditor_password}   (reads the board and the ledger)",
        ]
        for endpoint, token in endpoints:
            lines.append(
                f"Endpoint {endpoint.slug}: token {token}   MCP {settings.PUBLIC_URL}/mcp/{endpoint.slug}"
            )
        lines += ["=" * 72, ""]
        self.stdout.write("\n".join(lines))
