from __future__ import annotations

import os
import time
from typing import Any

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "switchboard.settings")

django_application = get_asgi_application()


async def application(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Django, with each request's arrival stamped before it can queue for a worker thread
    (the request deadline counts from here: switchboard.core.availability)."""
    scope["switchboard.arrived"] = time.monotonic()
    await django_application(scope, receive, send)
