"""The named limits a todo may carry to the claim gates: a pool, up to 8 tags, a rate limit.

Another app declares the names (``admission.limits``) and registers a check here from its
``AppConfig.ready()``, as it registers its claim gates; queues asks it at intake, so queues never
reads that app's tables. A todo naming a limit when nothing is registered to know the names is
refused: an undeclared name is never silently admitted.

The same app registers the observer of 429s, which ``fail {rate_limited: true}`` reports.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from queues.models import MAX_TODO_TAGS, check_limit_name
from switchboard.core.errors import InvalidArgument


@dataclass(frozen=True)
class Names:
    """What a todo names, canonical: tags deduplicated and sorted (the claim's lock order)."""

    pool: str | None = None
    tags: tuple[str, ...] = ()
    rate_limit: str | None = None

    @property
    def any(self) -> bool:
        return bool(self.pool or self.tags or self.rate_limit)


class DeclaredCheck(Protocol):
    def __call__(self, names: Names) -> None:
        """Raise ``InvalidArgument`` naming the field of the first undeclared name."""
        ...


_CHECKS: list[DeclaredCheck] = []


def register(check: DeclaredCheck) -> None:
    if check not in _CHECKS:
        _CHECKS.append(check)


def check(
    *, pool: str | None = None, tags: Sequence[str] | None = None, rate_limit: str | None = None
) -> Names:
    """The canonical names, or ``invalid_argument`` naming the field (format, count, declared)."""
    if pool is not None:
        check_limit_name(pool, field_name="pool")
    if rate_limit is not None:
        check_limit_name(rate_limit, field_name="rate_limit")
    if tags is not None and (isinstance(tags, str) or not isinstance(tags, Sequence)):
        raise InvalidArgument("tags must be a list of tag names", field="tags")
    for i, tag in enumerate(tags or ()):
        check_limit_name(tag, field_name=f"tags.{i}")
    unique = tuple(sorted(set(tags or ())))
    if len(unique) > MAX_TODO_TAGS:
        raise InvalidArgument(f"tags: at most {MAX_TODO_TAGS} tags", field="tags")
    names = Names(pool=pool, tags=unique, rate_limit=rate_limit)
    if names.any and not _CHECKS:
        field = "pool" if pool else "tags" if names.tags else "rate_limit"
        raise InvalidArgument(f"{field}: no limits are declared on this server", field=field)
    for declared in _CHECKS:
        declared(names)
    return names


class RateObserver(Protocol):
    def __call__(self, *, rate_limit: str, actor: Any, todo_id: Any = None) -> object:
        """Record one 429 against a rate limit (in the caller's transaction)."""
        ...


_OBSERVERS: list[RateObserver] = []


def register_rate_observer(observer: RateObserver) -> None:
    if observer not in _OBSERVERS:
        _OBSERVERS.append(observer)


def observe_rate_limited(*, rate_limit: str | None, actor: Any, todo_id: Any) -> None:
    """A todo's work met a 429: one observation against its rate limit."""
    if rate_limit is None or not _OBSERVERS:
        raise InvalidArgument("rate_limited: this todo names no rate limit", field="rate_limited")
    for observer in _OBSERVERS:
        observer(rate_limit=rate_limit, actor=actor, todo_id=todo_id)
