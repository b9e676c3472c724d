"""The doorbell tests share the pause tests' LISTEN connection, hook receiver and eager Celery."""

from __future__ import annotations

from tests.pause.conftest import _fast_password_hashing, eager_celery, hook_server, listener

__all__ = ["_fast_password_hashing", "eager_celery", "hook_server", "listener"]
