"""Reads of the named limits shared by every surface: what is declared and how full it is now.

``limits_status`` is the one answer to "how full is each limit" (the operator API, the CLI's
``limits list --json`` shape plus occupancy); occupancy is counted from the todos, never stored.
"""

from __future__ import annotations

from typing import Any

from django.db import connection

from admission.limits import rates, services
from admission.limits.models import Pool, RateLimit, TagLimit

_POOLS_SQL = """
SELECT p.name, (SELECT count(*) FROM queues_todo o WHERE o.state = 'claimed' AND o.pool = p.name)
FROM limits_pool p
"""
_TAGS_SQL = """
SELECT l.tag, (SELECT count(*) FROM queues_todo o
               WHERE o.state = 'claimed' AND o.tags <> '{}' AND o.tags @> ARRAY[l.tag])
FROM limits_taglimit l
"""


def limits_status() -> list[dict[str, Any]]:
    """Every declared limit in its one shape, with ``held`` (claims naming it now) for pools and
    tags, and for rates the effective limit, the 429s in the window and the claims this minute."""
    with connection.cursor() as cursor:
        cursor.execute(_POOLS_SQL)
        held = {("pool", name): count for name, count in cursor.fetchall()}
        cursor.execute(_TAGS_SQL)
        held |= {("tag", name): count for name, count in cursor.fetchall()}
    rate_states = {r.name: rates.state(r.name) for r in RateLimit.objects.all()}
    out = []
    for limit in services.limits_list():
        key = (limit["kind"], limit["name"])
        if key in held:
            limit["held"] = held[key]
        st = rate_states.get(limit["name"]) if limit["kind"] == "rate" else None
        if st is not None:
            limit |= {
                "effective_limit": st.effective,
                "observations": st.observations,
                "used_this_minute": st.used,
            }
        out.append(limit)
    return out


def declared_occupancy_limits() -> list[tuple[str, str, int, str]]:
    """(kind, name, limit, posture) of every pool, then every tag, by name."""
    declared = [("pool", p.name, p.slots, p.posture) for p in Pool.objects.all()]
    declared += [("tag", t.tag, t.limit, t.posture) for t in TagLimit.objects.all()]
    return declared
