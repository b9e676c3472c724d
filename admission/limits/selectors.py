"""Reads of the named limits shared by every surface: what is declared and how full it is now.

``limits_status`` is the one answer to "how full is each limit" (the operator API, the CLI's
``limits list --json`` shape plus occupancy); occupancy is counted from the todos, never stored.
"""

from __future__ import annotations

from typing import Any

from django.db import connection
from django.db.models import Count

from admission.limits import rates, services
from admission.limits.models import LimitPosture, Pool, QueueSettings, TagLimit
from queues.sql import gated
from switchboard.ledger import chain
from switchboard.ledger.models import LedgerEntry, LedgerKind

_POOLS_SQL = (
    f"SELECT p.name, {gated.claimed_in_pool('p.name')} FROM limits_pool p"
    " WHERE %(all)s OR p.name = ANY(%(names)s)"
)
_TAGS_SQL = (
    f"SELECT l.tag, {gated.claimed_with_tag('l.tag')} FROM limits_taglimit l"
    " WHERE %(all)s OR l.tag = ANY(%(names)s)"
)


def queue_declared(queue: str) -> bool:
    """Whether the limits app declared this queue name (its priority and aging): a name the
    queue app's own ``queue_known`` cannot see, which may not import this app."""
    return QueueSettings.objects.filter(queue=queue).exists()


def limit_out(limit: dict[str, Any]) -> dict[str, Any]:
    """A declared limit as every surface shows it: its one shape (``services.as_dict``, what the
    ledger records) with its version (the API's ETag), derived from that shape."""
    return {**limit, "version": services.limit_version(limit)}


def limits_status() -> list[dict[str, Any]]:
    """Every declared limit in its one shape, with ``held`` (claims naming it now) for pools and
    tags, and for rates the effective limit, the 429s in the window and the claims this minute."""
    return _with_status(services.limits_list(), every=True)


def limit_status(limit: dict[str, Any]) -> dict[str, Any]:
    """One limit (``services.as_dict``'s shape, as a write answers it) as the list shows it:
    with its version and how full it is now."""
    return _with_status([limit], every=False)[0]


def _with_status(limits: list[dict[str, Any]], *, every: bool) -> list[dict[str, Any]]:
    """``limits`` with their versions and occupancy; ``every``: they are every declared one."""
    held: dict[tuple[str, str], int] = {}
    with connection.cursor() as cursor:
        for kind, sql in (("pool", _POOLS_SQL), ("tag", _TAGS_SQL)):
            names = [x["name"] for x in limits if x["kind"] == kind]
            if names:
                cursor.execute(sql, {"all": every, "names": names})
                held |= {(kind, name): count for name, count in cursor.fetchall()}
    rate_states = {x["name"]: rates.state(x["name"]) for x in limits if x["kind"] == "rate"}
    out = []
    for limit in map(limit_out, limits):
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


def quarantines() -> list[dict[str, Any]]:
    """Every quarantine, replayed from the ledger alone: the limit and its manifest, in order."""
    return [
        {
            "seq": row.seq,
            "entry_hash": row.entry_hash,
            "at": row.at,
            "limit": (row.after or {}).get("limit"),
            "manifest": (row.after or {}).get("manifest"),
        }
        for row in LedgerEntry.objects.filter(kind=LedgerKind.LIMITS_QUARANTINE).order_by("seq")
    ]


def manifest_bytes(manifest: dict[str, Any]) -> bytes:
    """A manifest's canonical bytes (as the ledger hashes them)."""
    return chain.canonical(manifest)


def limits_overview() -> dict[str, Any]:
    """``limits status``: pools (slots, held, posture), tags (limit, held, posture), rates (base,
    effective, observations), queue settings, the grants held now (claims holding a grant), the
    waivers ever written and the quarantines (in force now; ever written)."""
    limits = limits_status()
    with connection.cursor() as cursor:
        cursor.execute(gated.GRANTS_HELD_SQL)
        (grants,) = cursor.fetchone()
    counts = dict(
        LedgerEntry.objects.filter(
            kind__in=[LedgerKind.LIMITS_WAIVER, LedgerKind.LIMITS_QUARANTINE]
        )
        .values_list("kind")
        .annotate(n=Count("seq"))
        .values_list("kind", "n")
    )
    return {
        "pools": [x for x in limits if x["kind"] == "pool"],
        "tags": [x for x in limits if x["kind"] == "tag"],
        "rates": [x for x in limits if x["kind"] == "rate"],
        "queues": services.queue_settings_list(),
        "grants": grants,
        "waivers": counts.get(LedgerKind.LIMITS_WAIVER, 0),
        "quarantines": {
            "in_force": [
                f"{x['kind']}:{x['name']}"
                for x in limits
                # Only a quarantine that refuses: a limit of 0 under advise or off admits.
                if x["kind"] in ("pool", "tag")
                and x.get("slots", x.get("limit")) == 0
                and x["posture"] == LimitPosture.ENFORCE
            ],
            "recorded": counts.get(LedgerKind.LIMITS_QUARANTINE, 0),
        },
    }


def declared_occupancy_limits() -> list[tuple[str, str, int, str]]:
    """(kind, name, limit, posture) of every pool, then every tag, by name."""
    declared = [("pool", p.name, p.slots, p.posture) for p in Pool.objects.all()]
    declared += [("tag", t.tag, t.limit, t.posture) for t in TagLimit.objects.all()]
    return declared
