"""Intake's and retry's question to the declarations: does every name a todo carries exist?

Asked inside the transaction that writes the todo, and the declarations found are locked
``FOR KEY SHARE`` until it commits: a delete (``services.limit_delete``) takes the row for
update before counting the live todos naming it, so it waits for that commit and counts the
todo, or commits first and the todo's write finds no declaration. KEY SHARE conflicts only with
a delete (or a key change): a change of the limit's numbers, a quarantine, and the rate limit's
claims (``rates.lock``: FOR NO KEY UPDATE) never wait for it.
"""

from __future__ import annotations

from django.contrib.postgres.expressions import ArraySubquery
from django.db import connection
from django.db.models import Q

from admission.limits.models import Pool, RateLimit, TagLimit
from queues.declared import Names

# One statement, whatever the todo names: each declaration found, locked.
_HOLD_SQL = """
WITH p AS (SELECT name FROM limits_pool WHERE name = %(pool)s FOR KEY SHARE),
     t AS (SELECT tag FROM limits_taglimit WHERE tag = ANY(%(tags)s::varchar[]) FOR KEY SHARE),
     r AS (SELECT name FROM limits_ratelimit WHERE name = %(rate)s FOR KEY SHARE)
SELECT (SELECT count(*) FROM p), ARRAY(SELECT tag FROM t), (SELECT count(*) FROM r)
"""


class Declarations:
    """``queues.declared.Declarations`` over this app's tables."""

    def hold(self, names: Names) -> list[tuple[str, str]]:
        with connection.cursor() as cursor:
            cursor.execute(
                _HOLD_SQL,
                {"pool": names.pool, "tags": list(names.tags), "rate": names.rate_limit},
            )
            pools, tags, rates = cursor.fetchone()
        missing: list[tuple[str, str]] = []
        if names.pool is not None and not pools:
            missing.append(("pool", names.pool))
        missing += [("tags", tag) for tag in names.tags if tag not in set(tags)]
        if names.rate_limit is not None and not rates:
            missing.append(("rate_limit", names.rate_limit))
        return missing

    def declared(self) -> Q:
        return (
            (Q(pool__isnull=True) | Q(pool__in=Pool.objects.values("name")))
            & Q(tags__contained_by=ArraySubquery(TagLimit.objects.values("tag")))
            & (Q(rate_limit__isnull=True) | Q(rate_limit__in=RateLimit.objects.values("name")))
        )


DECLARATIONS = Declarations()
