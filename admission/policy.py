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

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol
from uuid import UUID

from admission import windows
from admission.models import (
    MAX_CLAIMS_PER_WINDOW,
    MAX_IN_FLIGHT,
    MAX_WINDOWS,
    PRIMARY_WINDOW_KEY,
    WINDOW_START_RE,
    Posture,
    Weekday,
    WindowPeriod,
)
from queues.models import QUARANTINE_QUEUE, check_queue_name
from switchboard.core.errors import InvalidArgument
from switchboard.core.zones import not_a_zone

__all__ = [
    "COLUMN_OF_FIELD",
    "DEFAULT_POSTURE",
    "DEFAULT_WINDOW_START",
    "FIELD_OF_CONSTRAINT",
    "MAX_CLAIMS_PER_WINDOW",
    "MAX_IN_FLIGHT",
    "MAX_WINDOWS",
    "WINDOW_KEYS",
    "WINDOW_START_RE",
    "PolicySpec",
    "Window",
    "WindowLimit",
    "arguments_from_columns",
    "audited_windows",
    "place_of_field",
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
    "policy_extra_windows_valid": "windows",
}

# A stacked window's field (``windows[i].tz``) -> the column of the first window (i = 0).
_FIRST_WINDOW_COLUMN = {
    "limit": "max_claims_per_window",
    "period": "window_period",
    "tz": "window_tz",
    "start": "window_start",
    "weekday": "window_weekday",
}
_WINDOWS_FIELD_RE = re.compile(r"windows\[(\d+)\](?:\.(\w+))?")


def place_of_field(field: str | None) -> tuple[int | None, str | None]:
    """Where a form shows a refusal naming ``field``: (None, column) on the policy's own columns
    (the first window's included), (row, key) on the row of a stacked window after the first
    (row 0 is ``windows[1]``), or (None, None) for the form as a whole."""
    if field in COLUMN_OF_FIELD:
        return None, COLUMN_OF_FIELD[field]
    match = _WINDOWS_FIELD_RE.fullmatch(field or "")
    if match is None:
        return None, None
    index, key = int(match[1]), match[2] or "period"
    if index == 0:
        return None, _FIRST_WINDOW_COLUMN.get(key)
    return index - 1, key if key in _FIRST_WINDOW_COLUMN else None


class PolicyColumns(windows.WindowSpec, Protocol):
    """Anything that carries a policy's columns: the model, the engine's row (read-only). Its
    first window's four columns are a ``WindowSpec``'s."""

    @property
    def queue(self) -> str: ...

    @property
    def max_in_flight(self) -> int | None: ...

    @property
    def max_claims_per_window(self) -> int | None: ...

    @property
    def posture(self) -> str: ...

    @property
    def extra_windows(self) -> Any: ...


@dataclass(frozen=True)
class Window:
    """A calendar window, as stored. A cleaned spec always has ``tz`` and ``start``."""

    period: str
    tz: str | None
    start: str | None
    weekday: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"period": self.period, "tz": self.tz, "start": self.start, "weekday": self.weekday}

    @property
    def key(self) -> str:
        """The window's definition as admission_check formats it (NULL as empty): the counter
        key of a window after the first, and the identity no two windows of a policy share."""
        parts = (self.period, self.tz, self.start, self.weekday)
        return "|".join("" if part is None else str(part) for part in parts)

    @property
    def boundaries(self) -> tuple[str | None, ...]:
        """What decides where the window starts and ends: an hour window's start counts by its
        minutes alone (10:30 and 00:30 are both "every hour from :30")."""
        start = self.start
        if self.period == WindowPeriod.HOUR and start is not None:
            start = start[-2:]
        return (self.period, self.tz, start, self.weekday)


@dataclass(frozen=True)
class WindowLimit:
    """One of a policy's stacked windows: at most ``limit`` claims per ``window``."""

    limit: int
    window: Window
    key: str  # its counter key: PRIMARY_WINDOW_KEY for the first window, else window.key

    def as_dict(self) -> dict[str, Any]:
        return {"limit": self.limit, **self.window.as_dict()}


@dataclass(frozen=True)
class PolicySpec:
    """A policy of one queue: its limits, its windows and its posture.

    The first window is ``max_claims_per_window`` per ``window`` (the policy's window columns);
    ``more`` holds the stacked windows after it (the ``extra_windows`` column)."""

    queue: str
    max_in_flight: int | None
    max_claims_per_window: int | None
    window: Window | None
    posture: str
    more: tuple[WindowLimit, ...] = ()

    @property
    def windows(self) -> list[WindowLimit]:
        """Every window limit, the first one first."""
        if self.window is None or self.max_claims_per_window is None:
            return list(self.more)
        first = WindowLimit(self.max_claims_per_window, self.window, PRIMARY_WINDOW_KEY)
        return [first, *self.more]

    @classmethod
    def clean(
        cls,
        *,
        queue: str,
        max_in_flight: Any,
        max_claims_per_window: Any,
        window: Mapping[str, Any] | None,
        posture: Any = None,
        windows: Any = None,
    ) -> PolicySpec:
        """Validate a policy as the database would, naming the field that is wrong.

        The window limits come either as ``windows``, a list of {limit, period, tz, start,
        weekday} (stacked windows, refusals naming ``windows[i].field``), or as the single
        ``max_claims_per_window`` per ``window`` (a one-item list), never both."""
        if windows is not None:
            if max_claims_per_window is not None or window is not None:
                raise InvalidArgument(
                    "give the window limits either as windows or as max_claims_per_window "
                    "and window, not both",
                    field="windows",
                )
            more: tuple[WindowLimit, ...]
            max_claims_per_window, window, more = _clean_windows(windows)
            spec = cls.clean(
                queue=queue,
                max_in_flight=max_in_flight,
                max_claims_per_window=max_claims_per_window,
                window=window,
                posture=posture,
            )
            return cls(
                spec.queue,
                spec.max_in_flight,
                spec.max_claims_per_window,
                spec.window,
                spec.posture,
                more,
            )
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
        extra = row.extra_windows
        if isinstance(extra, str):  # a raw cursor reads jsonb as text (Django decodes JSONField)
            extra = json.loads(extra)
        more = tuple(_stored_window(item) for item in extra or ())
        return cls(
            row.queue, row.max_in_flight, row.max_claims_per_window, window, row.posture, more
        )

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
            "extra_windows": [item.as_dict() for item in self.more],
            "posture": self.posture,
        }

    def audited(self, endpoint_id: UUID | str) -> dict[str, Any]:
        """What the ledger records as a policy's before/after, and what verify compares. Rows
        already in a ledger hold this shape: changing it changes what verify reports.

        ``windows`` (the whole list, stacked windows included) was added with stacked windows;
        ``max_claims_per_window`` and ``window`` still name the first. Rows recorded before carry
        no ``windows``: verify reads them through ``audited_windows``."""
        return {
            "endpoint_id": str(endpoint_id),
            "queue": self.queue,
            "max_in_flight": self.max_in_flight,
            "max_claims_per_window": self.max_claims_per_window,
            "window": self.window.as_dict() if self.window else None,
            "windows": [item.as_dict() for item in self.windows],
            "posture": self.posture,
        }


def audited_windows(state: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """An audited policy state in today's shape: a row recorded before stacked windows (no
    ``windows``) held at most its one window, so its list is that window or nothing."""
    if state is None or "windows" in state:
        return None if state is None else dict(state)
    out = dict(state)
    window = state.get("window")
    limit = state.get("max_claims_per_window")
    out["windows"] = [] if window is None or limit is None else [{"limit": limit, **window}]
    return out


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


def _clean_window(window: Any, per_window: int | None, name: str = "window") -> Window:
    if not isinstance(window, Mapping):
        raise InvalidArgument(
            f"{name} must be an object {{period, tz, start, weekday}}", field=name
        )
    unknown = sorted(set(window) - set(WINDOW_KEYS))
    if unknown:
        raise InvalidArgument(f"{name} has no field {unknown[0]!r}", field=f"{name}.{unknown[0]}")
    if per_window is None:
        raise InvalidArgument(
            "a window only counts claims when max_claims_per_window is set", field="window"
        )
    period = window.get("period")
    if period not in WindowPeriod.values:
        raise InvalidArgument(
            f"{name}.period must be one of {', '.join(WindowPeriod.values)}", field=f"{name}.period"
        )
    tz = window.get("tz")
    if not isinstance(tz, str) or not tz:
        raise InvalidArgument(f"{name}.tz must name an IANA time zone", field=f"{name}.tz")
    if not windows.zone_exists(tz):
        raise InvalidArgument(f"{name}.tz {not_a_zone(tz)}", field=f"{name}.tz")
    start = window.get("start")
    start = DEFAULT_WINDOW_START if start is None else start
    if not isinstance(start, str) or not re.fullmatch(WINDOW_START_RE, start):
        raise InvalidArgument(f"{name}.start must be HH:MM (00:00 to 23:59)", field=f"{name}.start")
    weekday = window.get("weekday")
    if period == WindowPeriod.WEEK:
        if weekday not in Weekday.values:
            raise InvalidArgument(
                f"a week window needs {name}.weekday, one of {', '.join(Weekday.values)}",
                field=f"{name}.weekday",
            )
    elif weekday is not None:
        raise InvalidArgument(
            f"{name}.weekday applies only to a week window", field=f"{name}.weekday"
        )
    return Window(period, tz, start, weekday)


def _clean_windows(windows: Any) -> tuple[int, Mapping[str, Any], tuple[WindowLimit, ...]]:
    """Stacked windows: the first as (limit, window) for the columns, the others cleaned."""
    if not isinstance(windows, list | tuple) or not windows:
        raise InvalidArgument(
            "windows must be a list of {limit, period, tz, start, weekday}, at least one",
            field="windows",
        )
    if len(windows) > MAX_WINDOWS:
        raise InvalidArgument(f"a policy holds at most {MAX_WINDOWS} windows", field="windows")
    cleaned: list[WindowLimit] = []
    for i, item in enumerate(windows):
        name = f"windows[{i}]"
        if not isinstance(item, Mapping):
            raise InvalidArgument(
                f"{name} must be an object {{limit, period, tz, start, weekday}}", field=name
            )
        if "limit" not in item:
            raise InvalidArgument(f"{name}.limit is required", field=f"{name}.limit")
        limit = _limit(item["limit"], f"{name}.limit", MAX_CLAIMS_PER_WINDOW)
        if limit is None:
            raise InvalidArgument(f"{name}.limit must be a whole number", field=f"{name}.limit")
        window = _clean_window({k: v for k, v in item.items() if k != "limit"}, limit, name)
        if any(w.window.boundaries == window.boundaries for w in cleaned):
            raise InvalidArgument(
                f"{name} repeats an earlier window (same period, tz, start and weekday; an hour "
                "window starts at its minutes past every hour)",
                field=f"{name}.period",
            )
        cleaned.append(WindowLimit(limit, window, window.key if cleaned else PRIMARY_WINDOW_KEY))
    first = cleaned[0]
    return first.limit, first.window.as_dict(), tuple(cleaned[1:])


def _stored_window(item: Mapping[str, Any]) -> WindowLimit:
    window = Window(item["period"], item["tz"], item["start"], item.get("weekday"))
    return WindowLimit(item["limit"], window, window.key)


def arguments_from_columns(data: Mapping[str, Any]) -> dict[str, Any]:
    """The arguments of ``PolicySpec.clean`` / ``policy_set`` from flat columns (the admin's
    model form, the console's form): the window counts only with a window limit. Stacked
    windows (``extra_windows``, a list of {limit, period, tz, start, weekday}) make it a
    ``windows`` list, the columns' window first."""
    window: dict[str, Any] | None = None
    if data.get("max_claims_per_window") is not None or data.get("extra_windows"):
        window = {
            "period": data.get("window_period") or None,
            "tz": (data.get("window_tz") or "").strip() or None,
            "start": (data.get("window_start") or "").strip() or None,
        }
        if data.get("window_weekday"):
            window["weekday"] = data["window_weekday"]
    posture = data.get("posture") or DEFAULT_POSTURE
    if data.get("extra_windows"):
        assert window is not None
        first = {"limit": data.get("max_claims_per_window"), **window}
        return {
            "max_in_flight": data.get("max_in_flight"),
            "max_claims_per_window": None,
            "window": None,
            "windows": [first, *data["extra_windows"]],
            "posture": posture,
        }
    return {
        "max_in_flight": data.get("max_in_flight"),
        "max_claims_per_window": data.get("max_claims_per_window"),
        "window": window,
        "posture": posture,
    }
