"""Helpers for the named-limit tests."""

from __future__ import annotations

from typing import Any

from admission.limits.models import Pool, TagLimit
from tests.conftest import Personas, push
from tests.mcp.conftest import live_url  # noqa: F401  (a live server, for the MCP tests)


def pool(name: str = "gpu", slots: int = 2, posture: str = "enforce") -> Pool:
    return Pool.objects.create(name=name, slots=slots, posture=posture)


def tag(name: str, limit: int, posture: str = "enforce") -> TagLimit:
    return TagLimit.objects.create(tag=name, limit=limit, posture=posture)


def push_named(p: Personas, n: int = 1, queue: str = "inbox", **names: Any) -> list[Any]:
    return push(p, n, queue=queue, **names)
