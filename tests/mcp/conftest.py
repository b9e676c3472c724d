"""Fixtures for tests that talk to a live server: ``live_url`` (one uvicorn per test session)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from switchboard.liveserver import live_server
from tests.conftest import database_url


@pytest.fixture(scope="session")
def live_url(django_db_setup: Any, django_db_blocker: Any) -> Iterator[str]:
    with django_db_blocker.unblock():
        url = database_url()
    with live_server(url) as base:
        yield base
