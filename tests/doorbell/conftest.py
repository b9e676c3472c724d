"""The doorbell tests share the pause tests' LISTEN connection, hook receiver and eager Celery,
and the MCP tests' live server and npm clients."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.celery_worker import real_worker
from tests.mcp.conftest import js_clients, live_url
from tests.pause.conftest import _fast_password_hashing, eager_celery, hook_server, listener

__all__ = [
    "_fast_password_hashing",
    "eager_celery",
    "hook_server",
    "js_clients",
    "listener",
    "live_url",
]


@pytest.fixture
def celery_worker(tx_personas: Any) -> Iterator[Any]:
    """A real worker on the real broker (retries and their countdowns are the broker's and the
    worker's, not an eager shortcut)."""
    with real_worker() as worker:
        yield worker
