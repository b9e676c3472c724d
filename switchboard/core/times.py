"""Instants as every surface writes them: ISO 8601 in UTC with a ``Z``, to the microsecond
(pydantic's form, which the agent verbs write: a fraction of zero is left out, as RFC 3339
allows, so a window's bound reads ``08:00:00Z``), so the same instant reads the same on REST
(agent and operator), MCP, error objects and the CLI's ``--json``."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import overload


@overload
def iso(value: datetime) -> str: ...
@overload
def iso(value: None) -> None: ...
def iso(value: datetime | None) -> str | None:
    if value is None:
        return None
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")
