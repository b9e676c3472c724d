"""The doorbell tests share the pause tests' LISTEN connection, hook receiver and eager Celery,
and the MCP tests' live server and npm clients."""

from __future__ import annotations

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
