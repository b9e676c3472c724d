"""Helpers for the named-limit tests."""

from __future__ import annotations

from tests.mcp.conftest import live_url  # noqa: F401  (a live server, for the MCP tests)
