from __future__ import annotations

from django.contrib import admin
from django.urls import include, path

from queues.events import agent_events
from switchboard.api import urls as api_urls
from switchboard.console.signin import AdminSignInForm
from switchboard.mcp import mcp_view
from switchboard.views import metrics_view

# The admin's sign-in is throttled per account as the console's is (switchboard/console/signin.py).
admin.site.login_form = AdminSignInForm

# A malformed request or a Host outside ALLOWED_HOSTS: JSON (or JSON-RPC) for agents, not a page.
handler400 = "switchboard.middleware.bad_request"
# A path no route serves, likewise (the console keeps Django's page).
handler403 = "switchboard.middleware.forbidden"
handler404 = "switchboard.middleware.not_found"

urlpatterns = [
    path("admin/", admin.site.urls),
    path("metrics", metrics_view, name="metrics"),
    # The one NinjaAPI; every request body is bounded (1 MiB) before a view reads it.
    # The agents' doorbell as server-sent events (a stream, so outside the NinjaAPI).
    path("api/v1/agent/events", agent_events, name="agent-events"),
    path("api/v1/", api_urls()),
    # MCP over Streamable HTTP, one URL per endpoint (bounded inside the view).
    path("mcp/<str:slug>", mcp_view, name="mcp"),
    # The operations console: board, queues, todos, budgets, ledger (pages for humans).
    path("", include("switchboard.console.urls")),
    path("", include("admission.urls")),
]
