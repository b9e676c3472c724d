"""``manage.py check --deploy``: what production must be given rather than generate.

Production (``settings.PRODUCTION``: DATABASE_URL and REDIS_URL both set) runs on hosts that
come and go. A key generated into the data folder on first use differs from host to host: a
second host's ledger rows are signed with another key, and every verify then reads the chain as
tampered with; sessions signed on one host are refused on the next. Both are errors here; an
agents' URL left to its local default is a warning (agents would be told 127.0.0.1).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register

KEYS = {
    "SECRET_KEY": (
        "switchboard.E001",
        "sessions and CSRF tokens signed on one host are refused on another",
    ),
    "LEDGER_KEY": (
        "switchboard.E002",
        "ledger rows signed with each host's own key read as tampered with on every other "
        "(`ledger verify` reports the chain broken)",
    ),
}


@register(Tags.security, deploy=True)
def production_is_given_its_secrets(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    if not settings.PRODUCTION:
        return []
    given = settings.GIVEN_IN_ENVIRONMENT
    messages: list[CheckMessage] = [
        Error(
            f"{name} is not set: this host generated one into its data folder, so {why}.",
            hint=f"Set {name} (or {name}_FILE) to the same value on every host, and keep it.",
            id=check_id,
        )
        for name, (check_id, why) in KEYS.items()
        if name not in given
    ]
    if "SWITCHBOARD_PUBLIC_URL" not in given:
        messages.append(
            Warning(
                "SWITCHBOARD_PUBLIC_URL is not set: MCP URLs and .mcp.json snippets name "
                f"{settings.PUBLIC_URL}.",
                hint="Set it to the URL agents reach this service at.",
                id="switchboard.W003",
            )
        )
    return messages
