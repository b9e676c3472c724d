"""The one budget policy spec: its field names, defaults, validation, stored and audited shapes.

Every surface converts through here, so a policy has one shape:
- the API and MCP input schemas (``admission/schemas.py``) take their bounds and defaults from it
  and hand ``policy_set`` the arguments ``PolicySpec.clean`` takes;
- the console form and the admin turn their flat columns into those arguments with
  ``arguments_from_columns`` and show a refusal beside ``COLUMN_OF_FIELD[field]``;
- the CLI builds the same arguments from its flags;
- ``PolicySpec.clean`` validates as the database would (``admission/models.py`` holds the
  constraints), naming the field; ``FIELD_OF_CONSTRAINT`` names it when the database refuses;
- the model stores ``spec.columns()``; the engine's row is built from them;
- the ledger records ``spec.audited(endpoint_id)`` as before/after, and verify compares it.

A new kind of limit (several windows per policy, say) is added here first; the surfaces follow.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol
from uuid import UUID

from admission import windows
from admission.models import (
    MAX_CLAIMS_PER_WINDOW,
    MAX_IN_FLIGHT,
    WINDOW_START_RE,
    Posture,
    Weekday,
    WindowPeriod,
)
from queues.models import QUARANTINE_QUEUE, check_queue_name
from switchboard.core.errors import InvalidArgument

__all__ = [
    "COLUMN_OF_FIELD",
    "DEFAULT_POSTURE",
    "DEFAULT_WINDOW_START",
    "FIELD_OF_CONSTRAINT",
    "MAX_CLAIMS_PER_WINDOW",
    "MAX_IN_FLIGHT",
    "WINDOW_KEYS",
    "WINDOW_START_RE",
    "PolicySpec",
    "Window",
    "arguments_from_columns",
]

WINDOW_KEYS = ("period", "tz", "start", "weekday")
DEFAULT_WINDOW_START = "00:00"
DEFAULT_POSTURE: Final = "enforce"  # Posture.ENFORCE, as a literal the schemas can type

# The field a refusal names (the API's names) -> the column, which is also the form field that
# shows the error beside it.
COLUMN_OF_FIELD = {
    "max_in_flight": "max_in_flight",
    "max_claims_per_window": "max_claims_per_window",
    "window": "window_period",
    "window.period": "window_period",
    "window.tz": "window_tz",
    "window.start": "window_start",
    "window.weekday": "window_weekday",
    "posture": "posture",
}

# Which field a database constraint guards, for the (unexpected) case where the database refuses
# what validation let through: the refusal still names the field.
FIELD_OF_CONSTRAINT = {
    "policy_max_in_flight_range": "max_in_flight",
    "policy_max_claims_range": "max_claims_per_window",
    "policy_window_period_valid": "window.period",
    "policy_window_start_format": "window.start",
    "policy_window_weekday_valid": "window.weekday",
    "policy_has_a_limit": "max_in_flight",
    "policy_window_complete": "window",
    "policy_weekday_iff_week": "window.weekday",
    "policy_posture_valid": "posture",
}


class PolicyColumns(Protocol):
    """Anything that carries a policy's columns: the model, the engine's row."""

    queue: str
    max_in_flight: int | None
    max_claims_per_window: int | None
    window_period: str | None
    window_tz: str | None
    window_start: str | None
    window_weekday: str | None
    posture: str


@dataclass(frozen=True)
class Window:
    """A calendar window, as stored. A cleaned spec always has ``tz`` and ``start``."""

    period: str
    tz: str | None
    start: str | None
    weekday: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"period": self.period, "tz": self.tz, "start": self.start, "weekday": self.weekday}


@dataclass(frozen=True)
class PolicySpec:
    """A policy of one queue: its limits, its window and its posture."""

    queue: str
    max_in_flight: int | None
    max_claims_per_window: int | None
    window: Window | None
    posture: str

    @classmethod
    def clean(
        cls,
        *,
        queue: str,
        max_in_flight: Any,
        max_claims_per_window: Any,
        window: Mapping[str, Any] | None,
        posture: Any = None,
    ) -> PolicySpec:
        """Validate a policy as the database would, naming the field that is wrong."""
        check_queue_name(queue)
        if queue == QUARANTINE_QUEUE:
            raise InvalidArgument(
                "the quarantine queue is never delivered; it takes no budget", field="queue"
            )
        in_flight = _limit(max_in_flight, "max_in_flight", MAX_IN_FLIGHT)
        per_window = _limit(max_claims_per_window, "max_claims_per_window", MAX_CLAIMS_PER_WINDOW)
        if in_flight is None and per_window is None:
            raise InvalidArgument(
                "a budget needs max_in_flight, max_claims_per_window, or both",
                field="max_in_flight",
            )
        posture = DEFAULT_POSTURE if posture is None else posture
        if posture not in Posture.values:
            raise InvalidArgument(
                f"posture must be one of {', '.join(Posture.values)}", field="posture"
            )
        if window is None:
            if per_window is not None:
                raise InvalidArgument(
                    "max_claims_per_window needs a window: {period, tz, start, weekday}",
                    field="window",
                )
            return cls(queue, in_flight, None, None, posture)
        return cls(queue, in_flight, per_window, _clean_window(window, per_window), posture)

    @classmethod
    def of(cls, row: PolicyColumns) -> PolicySpec:
        """The spec of a stored policy, exactly as stored (not validated again)."""
        window = None
        if row.window_period is not None:
            window = Window(row.window_period, row.window_tz, row.window_start, row.window_weekday)
        return cls(row.queue, row.max_in_flight, row.max_claims_per_window, window, row.posture)

    def columns(self) -> dict[str, Any]:
        """The model's columns (the queue aside: it is part of the identity)."""
        w = self.window
        return {
            "max_in_flight": self.max_in_flight,
            "max_claims_per_window": self.max_claims_per_window,
            "window_period": w.period if w else None,
            "window_tz": w.tz if w else None,
            "window_start": w.start if w else None,
            "window_weekday": w.weekday if w else None,
            "posture": self.posture,
        }

    def audited(self, endpoint_id: UUID | str) -> dict[str, Any]:
        """What the ledger records as a policy's before/after, and what verify compares. Rows
        already in a ledger hold this shape: changing it changes what verify reports."""
        return {
            "endpoint_id": str(endpoint_id),
            "queue": self.queue,
            "max_in_flight": self.max_in_flight,
            "max_claims_per_window": self.max_claims_per_window,
            "window": self.window.as_dict() if self.window else None,
            "posture": self.posture,
        }


def _limit(value: Any, name: str, top: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"{name} must be a whole number or null", field=name)
    if not 0 <= value <= top:
        raise InvalidArgument(
            f"{name} must be between 0 and {top} (0 holds the queue: nothing is admitted)",
            field=name,
        )
    return value


def _clean_window(window: Any, per_window: int | None) -> Window:
    if not isinstance(window, Mapping):
        raise InvalidArgument(
            "window must be an object {period, tz, start, weekday}", field="window"
        )
    unknown = sorted(set(window) - set(WINDOW_KEYS))
    if unknown:
        raise InvalidArgument(f"window has no field {unknown[0]!r}", field=f"window.{unknown[0]}")
    if per_window is None:
        raise InvalidArgument(
            "a window only counts claims when max_claims_per_window is set", field="window"
        )
    period = window.get("period")
    if period not in WindowPeriod.values:
        raise InvalidArgument(
            f"window.period must be one of {', '.join(WindowPeriod.values)}", field="window.period"
        )
    tz = window.get("tz")
    if not isinstance(tz, str) or not tz:
        raise InvalidArgument("window.tz must name an IANA time zone", field="window.tz")
    if not windows.zone_exists(tz):
        raise InvalidArgument(f"window.tz {tz!r} is not a known IANA time zone", field="window.tz")
    start = window.get("start")
    start = DEFAULT_WINDOW_START if start is None else start
    if not isinstance(start, str) or not re.fullmatch(WINDOW_START_RE, start):
        raise InvalidArgument("window.start must be HH:MM (00:00 to 23:59)", field="window.start")
    weekday = window.get("weekday")
    if period == WindowPeriod.WEEK:
        if weekday not in Weekday.values:
            raise InvalidArgument(
                f"a week window needs window.weekday, one of {', '.join(Weekday.values)}",
                field="window.weekday",
            )
    elif weekday is not None:
        raise InvalidArgument(
            "window.weekday applies only to a week window", field="window.weekday"
        )
    return Window(period, tz, start, weekday)


def arguments_from_columns(data: Mapping[str, Any]) -> dict[str, Any]:
    """The arguments of ``PolicySpec.clean`` / ``policy_set`` from flat columns (the admin's
    model form, the console's form): the window counts only with a window limit."""
    window: dict[str, Any] | None = None
    if data.get("max_claims_per_window") is not None:
        window = {
            "period": data.get("window_period") or None,
            "tz": (data.get("window_tz") or "").strip() or None,
            "start": (data.get("window_start") or "").strip() or None,
        }
        if data.get("window_weekday"):
            window["weekday"] = data["window_weekday"]
    return {
        "max_in_flight": data.get("max_in_flight"),
        "max_claims_per_window": data.get("max_claims_per_window"),
        "window": window,
        "posture": data.get("posture") or DEFAULT_POSTURE,
    }
