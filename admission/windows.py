"""Window arithmetic for admission policies: where a claims-per-window budget's window begins and ends.

A window is the span between two consecutive boundaries. Boundaries fall at a declared local
wall-clock time in an IANA zone:

- ``hour``: every hour at the start's minute. The hour part of the start is ignored, so
  ``"07:15"`` and ``"00:15"`` both mean "at :15 past every local hour".
- ``day``: every day at ``HH:MM`` local.
- ``week``: every week on the weekday at ``HH:MM`` local.

A local time that does not exist (a DST gap) resolves to the first valid instant after the gap,
which is the transition instant itself. A local time that exists twice (a DST overlap) resolves to
its first occurrence. A window that contains a transition is simply longer or shorter: a 25-hour
fall-back day is one window.

For hourly windows the same rule means that in a fall-back overlap the repeated local ``01:MM``
counts once, at its first occurrence, so the window that holds the overlap is longer by the size of
the overlap (two hours for a one-hour overlap). In a spring-forward gap the ``:MM`` inside the gap
moves to the transition instant; if several local boundaries fall in one gap they collapse into it.

Resolution is non-decreasing in local wall time, so boundaries tile time: every instant lies in
exactly one window, and every window has positive length.

The functions are pure and take any object shaped like :class:`WindowSpec`, which
``admission.models.AdmissionPolicy`` is. A spec that cannot be evaluated raises
:class:`WindowUnavailable`, which the claim path maps to ``admission_unavailable`` (fail closed).
"""

from __future__ import annotations

import re
import zoneinfo
from dataclasses import dataclass
from datetime import UTC, datetime, time, timedelta
from typing import Protocol

from switchboard.core.zones import zone_exists

__all__ = ["zone_exists"]

_START_RE = re.compile(r"([01][0-9]|2[0-3]):([0-5][0-9])")
_WEEKDAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_STEPS = {"hour": timedelta(hours=1), "day": timedelta(days=1), "week": timedelta(weeks=1)}

# Names that available_timezones() may list but that depend on the host ("localtime" is whatever
# the machine is set to) or carry no rules ("Factory" means "local time unknown").
# The candidate span doubles up to this many steps either side of t before giving up. Ordinary
# transitions need one step; a skipped day (Samoa, 2011) needs a few dozen hourly steps.
_MAX_SPAN = 256


class WindowSpec(Protocol):
    @property
    def window_period(self) -> str | None: ...

    @property
    def window_tz(self) -> str | None: ...

    @property
    def window_start(self) -> str | None: ...

    @property
    def window_weekday(self) -> str | None: ...


@dataclass(frozen=True)
class Window:
    """A window spec that is not a policy row, for callers and tests."""

    window_period: str | None
    window_tz: str | None
    window_start: str | None
    window_weekday: str | None = None


class WindowUnavailable(Exception):
    """The spec cannot be evaluated: an unknown zone, a malformed start, period or weekday."""


@dataclass(frozen=True)
class _Parsed:
    period: str
    tz: str
    hour: int
    minute: int
    weekday: int | None  # Mon == 0, only for week


def _parse(spec: WindowSpec) -> _Parsed:
    period, tz, start = spec.window_period, spec.window_tz, spec.window_start
    if period is None or tz is None or start is None:
        raise WindowUnavailable("the window needs a period, a zone and a start")
    if period not in _STEPS:
        raise WindowUnavailable(f"unknown window period {period!r}")
    match = _START_RE.fullmatch(start)
    if match is None:
        raise WindowUnavailable(f"window start {start!r} is not HH:MM")
    weekday = None
    # A weekday on an hour or day window does not change its boundaries, so it is ignored.
    if period == "week":
        if spec.window_weekday not in _WEEKDAYS:
            raise WindowUnavailable(f"a week window needs a weekday, got {spec.window_weekday!r}")
        weekday = _WEEKDAYS.index(spec.window_weekday)
    return _Parsed(period, tz, int(match[1]), int(match[2]), weekday)


def _zone(name: str) -> zoneinfo.ZoneInfo:
    if not zone_exists(name):
        raise WindowUnavailable(f"unknown time zone {name!r}")
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError) as exc:
        raise WindowUnavailable(f"time zone {name!r} cannot be loaded") from exc


def _resolve(local: datetime, zone: zoneinfo.ZoneInfo) -> datetime:
    """The UTC instant of a naive local wall time: first occurrence, or the end of a gap."""
    first = local.replace(tzinfo=zone, fold=0).astimezone(UTC)
    if first.astimezone(zone).replace(tzinfo=None) == local:
        return first
    # In a gap, fold=0 reads the wall time with the offset before the transition and fold=1 with
    # the offset after, so the transition lies between the two readings. The transition is the
    # first valid instant after the gap. Transitions fall on whole seconds, so bisect seconds.
    lo = int(local.replace(tzinfo=zone, fold=1).timestamp())
    hi = int(first.timestamp())
    before = datetime.fromtimestamp(lo, zone).utcoffset()
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if datetime.fromtimestamp(mid, zone).utcoffset() == before:
            lo = mid
        else:
            hi = mid
    return datetime.fromtimestamp(hi, UTC)


def _anchor(parsed: _Parsed, local: datetime) -> datetime:
    """A naive local boundary near ``local``; the others are whole steps away from it."""
    if parsed.period == "hour":
        return datetime.combine(local.date(), time(local.hour, parsed.minute))
    day = local.date()
    if parsed.weekday is not None:
        day -= timedelta(days=(day.weekday() - parsed.weekday) % 7)
    return datetime.combine(day, time(parsed.hour, parsed.minute))


def current_window(spec: WindowSpec, t: datetime) -> tuple[datetime, datetime]:
    """The window holding ``t``: its start (``<= t``) and its next boundary (``> t``), in UTC."""
    if t.tzinfo is None or t.utcoffset() is None:
        raise ValueError("t must be an aware datetime")
    parsed = _parse(spec)
    zone = _zone(parsed.tz)
    now = t.astimezone(UTC)
    anchor = _anchor(parsed, now.astimezone(zone).replace(tzinfo=None))
    step = _STEPS[parsed.period]
    # Resolution is non-decreasing in local time, so the boundaries <= t come before those > t.
    # Once the candidates straddle t they hold both neighbours; a gap or overlap wider than the
    # span can leave one side empty, so the span widens until it does not.
    span = 1
    while span <= _MAX_SPAN:
        candidates = [_resolve(anchor + k * step, zone) for k in range(-span, span + 1)]
        starts = [c for c in candidates if c <= now]
        ends = [c for c in candidates if c > now]
        if starts and ends:
            return max(starts), min(ends)
        span *= 2
    raise WindowUnavailable("no window boundary found near t")


def window_start(spec: WindowSpec, t: datetime) -> datetime:
    """The start of the window holding ``t``, an aware UTC datetime ``<= t``."""
    return current_window(spec, t)[0]


def next_boundary(spec: WindowSpec, t: datetime) -> datetime:
    """The end of the window holding ``t`` and the start of the next, an aware UTC datetime."""
    return current_window(spec, t)[1]


def describe(spec: WindowSpec) -> str:
    """A short phrase such as ``per day from 00:00 America/Los_Angeles``.

    The zone is not looked up, so a policy whose zone left the tz database can still be shown.
    """
    parsed = _parse(spec)
    if parsed.period == "hour":
        return f"per hour from :{parsed.minute:02d} {parsed.tz}"
    at = f"{parsed.hour:02d}:{parsed.minute:02d}"
    if parsed.weekday is not None:
        at = f"{_WEEKDAYS[parsed.weekday]} {at}"
    return f"per {parsed.period} from {at} {parsed.tz}"
