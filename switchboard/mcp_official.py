"""EVALUATION PROTOTYPE (issue 10 item 7): /mcp/<slug> on the official ``mcp`` package's server.

Mounted in front of Django by switchboard.asgi when SWITCHBOARD_MCP_SERVER=official. Auth by the
endpoint token (as the hand-written layer), tools generated from the verb registry, the
session manager of the official package (Streamable HTTP, JSON responses).
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

import mcp.types as types
from asgiref.sync import sync_to_async
from django.http import HttpRequest
from mcp.server.lowlevel import Server
from django.conf import settings
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from starlette.responses import JSONResponse

from switchboard import verbs
from switchboard.auth import authenticate_agent, check_endpoint_rate
from switchboard.errors import DomainError, Unauthorized

STRUCTURED = ("2026-07-28", "2025-11-25", "2025-06-18")
ACTOR = "switchboard.actor"


def _actor(ctx: Any) -> Any:
    return ctx.request.scope[ACTOR]


async def _list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
    actor = _actor(ctx)
    structured = ctx.protocol_version in STRUCTURED
    tools = [
        types.Tool(
            name=spec.name,
            description=spec.description,
            input_schema=spec.input_schema(),
            output_schema=spec.output_schema() if structured else None,
        )
        for spec in verbs.granted(actor)
    ]
    return types.ListToolsResult(tools=tools)


def _call_sync(actor: Any, name: str, arguments: Any) -> tuple[dict[str, Any], bool]:
    spec = verbs.get(name)
    if spec is None:
        raise MCPError(-32602, f"Unknown tool: {name}")
    try:
        check_endpoint_rate(actor.endpoint)
        verbs.check_grant(actor, name)
        return verbs.call(actor, spec, spec.parse(arguments)), False
    except DomainError as exc:
        return exc.as_dict(), True


async def _call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
    output, is_error = await sync_to_async(_call_sync, thread_sensitive=False)(
        _actor(ctx), params.name, params.arguments
    )
    text = json.dumps(output, separators=(",", ":"))
    structured = ctx.protocol_version in STRUCTURED and not is_error
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)],
        structured_content=output if structured else None,
        is_error=is_error,
    )


server: Server[Any] = Server(
    "switchboard", version="1", on_list_tools=_list_tools, on_call_tool=_call_tool
)
STATELESS = os.environ.get("SWITCHBOARD_MCP_STATELESS", "0") == "1"


def _security() -> TransportSecuritySettings:
    hosts = [h for h in settings.ALLOWED_HOSTS if h != "*"]
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=hosts + [f"{h}:*" for h in hosts],
        allowed_origins=[*settings.CSRF_TRUSTED_ORIGINS]
        + [f"{scheme}://{h}{port}" for h in hosts for scheme in ("http", "https")
           for port in ("", ":*")],
    )  # fmt: skip


manager = StreamableHTTPSessionManager(
    server, json_response=True, stateless=STATELESS, security_settings=_security()
)
_started: asyncio.Event | None = None


async def _ensure_running() -> None:
    """Enter the manager's run() once, in a task that lives as long as the process."""
    global _started
    if _started is None:
        _started = asyncio.Event()
        started = _started

        async def keep() -> None:
            async with manager.run():
                started.set()
                await asyncio.Event().wait()

        asyncio.get_running_loop().create_task(keep())
    await _started.wait()


def _authenticate(headers: dict[str, str], slug: str) -> Any:
    scheme, _, token = headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("send Authorization: Bearer sbk_… (the endpoint's token)")
    actor = authenticate_agent(HttpRequest(), token.strip(), via="mcp", charge_rate=False)
    if actor.endpoint.slug != slug:
        from switchboard.errors import Forbidden

        raise Forbidden("this token belongs to another endpoint's MCP URL")
    return actor


async def mcp_app(scope: Any, receive: Any, send: Any) -> None:
    await _ensure_running()
    slug = scope["path"].rstrip("/").rsplit("/", 1)[-1]
    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
    try:
        actor = await sync_to_async(_authenticate, thread_sensitive=False)(headers, slug)
    except DomainError as exc:
        body = {"jsonrpc": "2.0", "id": None, "error": {"code": -32000, "message": exc.message,
                                                       "data": exc.as_dict()}}  # fmt: skip
        await JSONResponse(body, status_code=exc.status)(scope, receive, send)
        return
    scope[ACTOR] = actor
    await manager.handle_request(scope, receive, send)
