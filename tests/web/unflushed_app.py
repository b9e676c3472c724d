"""``switchboard.asgi:application`` with the counters' flusher thread made idle, for the
shutdown tests: an increment then reaches Redis only through a flush at the process's stop."""

from __future__ import annotations

from switchboard.core import counters

counters.FLUSH_INTERVAL_SECONDS = 24 * 3600.0

from switchboard.asgi import application  # noqa: E402

__all__ = ["application"]
