"""Intake's question to the declarations: does every name a new todo carries exist?"""

from __future__ import annotations

from admission.limits.models import Pool, RateLimit, TagLimit
from queues.declared import Names
from switchboard.core.errors import InvalidArgument


def check_declared(names: Names) -> None:
    """Refuse the first undeclared name, naming its field (``pool``, ``tags``, ``rate_limit``)."""
    if names.pool is not None and not Pool.objects.filter(name=names.pool).exists():
        raise InvalidArgument(f"pool {names.pool!r} is not declared", field="pool")
    if names.tags:
        known = set(TagLimit.objects.filter(tag__in=names.tags).values_list("tag", flat=True))
        for tag in names.tags:
            if tag not in known:
                raise InvalidArgument(f"tags: tag {tag!r} has no declared limit", field="tags")
    if (
        names.rate_limit is not None
        and not RateLimit.objects.filter(name=names.rate_limit).exists()
    ):
        raise InvalidArgument(
            f"rate limit {names.rate_limit!r} is not declared", field="rate_limit"
        )
