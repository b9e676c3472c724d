"""The named limits a todo may carry to the claim gates: a pool, up to 8 tags, a rate limit.

Another app declares the names (``admission.limits``) and registers its ``Declarations`` here
from its ``AppConfig.ready()``, as it registers its claim gates; queues asks it at intake and at
an operator's retry, so queues never reads that app's tables. A todo naming a limit when nothing
is registered to know the names is refused: an undeclared name is never silently admitted.

Both ask inside the transaction that writes the todo, and the answer locks the declarations it
found against their deletion until that commits (``Declarations.hold``): a limit's delete counts
the live todos naming it after taking its row for update, so of a create (or retry) and a delete
at once, either the delete sees the todo (409) or the create sees no declaration (400).

The same app registers the observer of 429s, which ``fail {rate_limited: true}`` reports.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from django.db.models import Q

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


# The reason a todo naming a limit that is not declared (any more) is refused: its retry, its
# claim (``admission.limits.gates``). Details name the limit's ``kind`` (pool, tag, rate) and name.
UNDECLARED = "limit_undeclared"

# The kind of limit each field of ``Names`` names (as the limits API names kinds).
KINDS = {"pool": "pool", "tags": "tag", "rate_limit": "rate"}


class Declarations(Protocol):
    def hold(self, names: Names) -> list[tuple[str, str]]:
        """In the caller's transaction, lock the declarations ``names`` names against deletion
        until it ends; answer (field, name) of each one not declared, in field order."""
        ...

    def declared(self) -> Q:
        """The todos every limit name of which is declared (a filter over todos)."""
        ...


_DECLARATIONS: list[Declarations] = []


def register(declarations: Declarations) -> None:
    if declarations not in _DECLARATIONS:
        _DECLARATIONS.append(declarations)


def of(todo: Any) -> Names:
    """What a stored todo names."""
    return Names(pool=todo.pool, tags=tuple(sorted(todo.tags or ())), rate_limit=todo.rate_limit)


def undeclared(names: Names) -> list[tuple[str, str]]:
    """(field, name) of each limit ``names`` names that is not declared now, the declared ones
    locked against deletion in the caller's transaction (nothing asked when it names none)."""
    if not names.any:
        return []
    if not _DECLARATIONS:
        field = "pool" if names.pool else "tags" if names.tags else "rate_limit"
        return [(field, getattr(names, field) if field != "tags" else names.tags[0])]
    return [found for d in _DECLARATIONS for found in d.hold(names)]


def hold(names: Names) -> None:
    """At intake, in the transaction that writes the todo: ``invalid_argument`` naming the
    field of the first undeclared name; the declared ones locked until it commits (one
    statement, only for a todo naming a limit)."""
    missing = undeclared(names)
    if not missing:
        return
    field, name = missing[0]
    if not _DECLARATIONS:
        raise InvalidArgument(f"{field}: no limits are declared on this server", field=field)
    if field == "tags":
        raise InvalidArgument(f"tags: tag {name!r} has no declared limit", field=field)
    said = "pool" if field == "pool" else "rate limit"
    raise InvalidArgument(f"{said} {name!r} is not declared", field=field)


def declared() -> Q:
    """The todos every limit name of which is declared (``retryable``)."""
    if not _DECLARATIONS:
        return Q(pool__isnull=True, tags=[], rate_limit__isnull=True)
    q = Q()
    for d in _DECLARATIONS:
        q &= d.declared()
    return q


def check(
    *, pool: str | None = None, tags: Sequence[str] | None = None, rate_limit: str | None = None
) -> Names:
    """The canonical names, or ``invalid_argument`` naming the field (format, count). Whether
    they are declared is ``hold``'s, in the transaction that writes the todo."""
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
    return Names(pool=pool, tags=unique, rate_limit=rate_limit)


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
