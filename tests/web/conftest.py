"""Helpers for the console's page tests (Django's test client)."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest
from django.db import connection
from django.test import Client

from admission import services as admission_services
from admission.models import AdmissionPolicy
from tests.conftest import Personas

HTMX = {"HX-Request": "true"}


@pytest.fixture(autouse=True)
def _fast_and_generous(settings: Any) -> None:
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    settings.POLICY_WRITE_RATE_LIMIT = (0, 0)


def signed_in(user: Any, **kw: Any) -> Client:
    client = Client(**kw)
    client.force_login(user)
    return client


def budget(
    p: Personas,
    queue: str = "inbox",
    *,
    max_in_flight: int | None = None,
    max_claims_per_window: int | None = None,
    tz: str = "UTC",
    posture: str = "enforce",
) -> AdmissionPolicy:
    window = {"period": "day", "tz": tz, "start": "00:00"} if max_claims_per_window else None
    return admission_services.policy_set(
        actor=p.as_human(),
        endpoint=p.agent,
        queue=queue,
        max_in_flight=max_in_flight,
        max_claims_per_window=max_claims_per_window,
        window=window,
        posture=posture,
    )


def policy_form(**overrides: Any) -> dict[str, str]:
    form = {
        "max_in_flight": "2",
        "max_claims_per_window": "5",
        "window_period": "day",
        "window_tz": "Europe/Paris",
        "window_start": "00:00",
        "window_weekday": "",
        "posture": "enforce",
        "action": "preview",
    }
    form.update(overrides)
    return form


def previewed(html: str) -> dict[str, str]:
    """What the preview's page sends with its save: the preview's token and the version of the
    budget it compared with."""
    match = re.search(r'name="previewed" value="([^"]+)"', html)
    assert match, "the page shows no preview"
    return {"previewed": match.group(1), "version": hidden_version(html)}


def hidden_version(html: str) -> str:
    """The budget version a console or admin page carries in its hidden ``version`` field."""
    match = re.search(r'name="version" value="([^"]+)"', html)
    assert match, "the page carries no version"
    return match.group(1)


def in_thread(fn: Any) -> Any:
    """``fn`` on another thread (another connection, as another process would), its connection
    closed after: awaitable from a test's event loop, where the ORM may not run."""

    def run() -> Any:
        try:
            return fn()
        finally:
            connection.close()

    return asyncio.get_running_loop().run_in_executor(None, run)
