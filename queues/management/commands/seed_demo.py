"""Seed demo data on first run only: an operator login, two endpoints and a few queues of todos.

Credentials are printed once, on the run that creates them. Later runs change nothing; with
``--force`` a run adds what of the demo data is missing and keeps what exists.
"""

from __future__ import annotations

import secrets
from typing import Any

from django.contrib.auth.models import Group, User
from django.core.management.base import CommandParser
from django.db import transaction

from queues import services
from queues.access import AUDITORS_GROUP, HumanActor, SystemActor
from queues.models import Endpoint, TodoSource
from switchboard.core.cli import SwitchboardCommand

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


# slug, name, queues
DEMO_ENDPOINTS = (
    ("triage", "Triage agent", ["inbox", "research"]),
    ("deployer", "Deploy agent", ["deploys", "inbox"]),
)


class Command(SwitchboardCommand):
    help = "Create demo data (an operator, an auditor, two endpoints, todos) if no user exists."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--force",
            action="store_true",
            help="seed even if users exist: add what of the demo data is missing (a demo user or "
            "endpoint that exists is kept as it is, its password or token unchanged)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if User.objects.exists() and not options["force"]:
            if User.objects.filter(username=OPERATOR).exists():
                self.stdout.write(
                    "Demo data: already seeded (logins were printed on the first run)."
                )
            else:
                # Someone made users before the first start (createsuperuser): no demo data
                # was ever made here, whatever the first start would have printed.
                self.stdout.write(
                    "Demo data: not seeded, since this database has users of its own; "
                    "`python manage.py seed_demo --force` adds the demo's beside them."
                )
            return
        with transaction.atomic():
            operator, password = _user(OPERATOR, superuser=True)
            auditor, auditor_password = _user(AUDITOR)
            if auditor_password is not None:
                # The group and its view permissions come from a migration.
                auditors, _ = Group.objects.get_or_create(name=AUDITORS_GROUP)
                auditor.groups.add(auditors)
            vended = [
                _endpoint(operator, slug, name, queues)
                for slug, name, queues in DEMO_ENDPOINTS
                if not Endpoint.objects.filter(slug=slug).exists()
            ]
        if password is None and auditor_password is None and not vended:
            self.stdout.write(
                "Demo data: nothing to add (the demo users and endpoints exist; their secrets "
                "were printed when they were created)."
            )
            return
        self._banner(password, auditor_password, vended)

    def _banner(
        self,
        password: str | None,
        auditor_password: str | None,
        endpoints: list[tuple[Endpoint, str]],
    ) -> None:
        from django.conf import settings

        kept = "exists; password unchanged"
        lines = [
            "",
            "=" * 72,
            "First run: demo data created. These secrets are shown once; keep them."
            if password is not None
            and auditor_password is not None
            and len(endpoints) == len(DEMO_ENDPOINTS)
            else "Demo data: what was missing is created (what existed is kept). New secrets "
            "are shown once; keep them.",
            f"Demo login: {OPERATOR} / {password}   (superuser; /admin/ and the board)"
            if password is not None
            else f"Operator: {OPERATOR} ({kept})",
            f"Auditor login: {AUDITOR} / {auditor_password}   (reads the board and the ledger)"
            if auditor_password is not None
            else f"Auditor: {AUDITOR} ({kept})",
        ]
        for endpoint, token in endpoints:
            lines.append(
                f"Endpoint {endpoint.slug}: token {token}   MCP {settings.PUBLIC_URL}/mcp/{endpoint.slug}"
            )
        lines += ["=" * 72, ""]
        self.stdout.write("\n".join(lines))


def _user(username: str, *, superuser: bool = False) -> tuple[User, str | None]:
    """The demo user: the one that exists (password None: it is not changed), or a new one
    with a fresh password."""
    existing = User.objects.filter(username=username).first()
    if existing is not None:
        return existing, None
    password = secrets.token_urlsafe(12)
    if superuser:
        return User.objects.create_superuser(username, password=password), password
    return User.objects.create_user(username, password=password, is_staff=True), password


def _endpoint(owner: User, slug: str, name: str, queues: list[str]) -> tuple[Endpoint, str]:
    """Vend a demo endpoint and put the demo todos of its queues on it."""
    endpoint, token = services.endpoint_vend(
        owner=owner, name=name, queues=queues, slug=slug, actor=SystemActor(via="seed")
    )
    actor = HumanActor(owner, via="cli")
    for queue, titles in DEMO_TODOS.items():
        if queue not in endpoint.scope_queues:
            continue
        for title in titles:
            services.todo_create(
                actor=actor, endpoint=endpoint, queue=queue, title=title, source=TodoSource.DEMO
            )
    return endpoint, token
