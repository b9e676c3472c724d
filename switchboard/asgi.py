from __future__ import annotations

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "switchboard.settings")

application = get_asgi_application()

if os.environ.get("SWITCHBOARD_MCP_SERVER") == "official":  # evaluation prototype (issue 10)
    from switchboard.mcp_official import mcp_app

    django_app = application

    async def application(scope, receive, send):  # type: ignore[no-untyped-def]
        if scope["type"] == "http" and scope["path"].startswith("/mcp/"):
            await mcp_app(scope, receive, send)
        else:
            await django_app(scope, receive, send)
