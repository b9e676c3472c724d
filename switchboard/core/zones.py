"""Time zones by IANA name: which exist, and a viewer's zone from a cookie."""

from __future__ import annotations

import functools
import zoneinfo
from datetime import UTC, tzinfo
from urllib.parse import unquote

# Names in the zone database that are not zones a person would pick.
_NOT_ZONES = frozenset({"localtime", "posixrules", "Factory"})


@functools.cache
def _zone_names() -> frozenset[str]:
    return frozenset(zoneinfo.available_timezones() - _NOT_ZONES)


def zone_exists(name: str) -> bool:
    """Whether ``name`` is a known IANA zone, for refusing a policy at write time."""
    return name == "UTC" or name in _zone_names()


@functools.cache
def _by_folded_name() -> dict[str, str]:
    return {_fold(z): z for z in _zone_names() | {"UTC"}}


def _fold(name: str) -> str:
    return name.strip().casefold().replace(" ", "_")


# How much of a refused name a refusal repeats: the longest zone name is 32 characters. A 10,000
# character one was repeated whole, twice on the budget page.
ECHOED = 64


def not_a_zone(name: str) -> str:
    """Why ``name`` is refused, with the zone it was likely meant to be: IANA names are case
    sensitive, so ``europe/berlin`` and ``Europe/New York`` are not zones, but say which is."""
    meant = _by_folded_name().get(_fold(name)) if isinstance(name, str) else None
    hint = f" (did you mean {meant!r}?)" if meant and meant != name else ""
    if isinstance(name, str) and len(name) > ECHOED:  # no zone is this long: the start says it
        return f"{name[:ECHOED]!r}… ({len(name)} characters) is not a known IANA time zone"
    return f"{name!r} is not a known IANA time zone{hint}"


@functools.cache
def zones() -> list[str]:
    """Every IANA zone the window math accepts, for the searchable zone lists."""
    return sorted(z for z in zoneinfo.available_timezones() | {"UTC"} if zone_exists(z))


def zone_named(name: str | None) -> tuple[str, tzinfo]:
    """A viewer's zone by IANA name, UTC when absent or unknown. Older copies of static/js/tz.js
    wrote the name URL-encoded (``Europe%2FParis``); those cookies still count."""
    if name and "%" in name:
        name = unquote(name)
    if name and zone_exists(name):
        try:
            return name, zoneinfo.ZoneInfo(name)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            pass
    return "UTC", UTC
