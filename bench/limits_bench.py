"""Named-limits bench (issue 13): claim+complete cycles per second of todos naming a pool and two
tags against the same todos naming nothing, at 8 concurrent claimers.

The limits are declared with room never to refuse (enforce, a million slots), so the figure is
what the named gates cost on the claim path far from the caps: the pool's and the two tags'
locks taken shared in their fixed order, occupancy counted under them, the grant and end ledger
rows, and the skip arrays in the candidate statement. The two phases of a pair run back to back (plain first) so each ratio compares one
moment; ``repeats`` pairs, judged on the median ratio. Target: named ≥ 0.5× unnamed at 8.
"""

from __future__ import annotations

import secrets
from typing import Any

from bench.admission_bench import _INITIAL_RATE_GUESS, QUEUE, _measure
from bench.common import summary

CLAIMERS = int(__import__("os").environ.get("BENCH_CLAIMERS", "8"))
TARGET_NAMED_VS_PLAIN_AT_8 = 0.5
ROOM = 1_000_000


def run(duration_s: float, repeats: int = 3) -> dict[str, Any]:
    from django.contrib.auth import get_user_model

    from admission.limits import services as limit_services
    from queues import services
    from queues.access import HumanActor, SystemActor
    from queues.models import Endpoint

    tag = secrets.token_hex(4)
    user = get_user_model().objects.create_superuser(f"bench-limits-{tag}")
    actor = HumanActor(user, via="cli")
    pool, tags = f"bench-pool-{tag}", [f"bench-a-{tag}", f"bench-b-{tag}"]

    def vend(name: str) -> Any:
        return services.endpoint_vend(
            actor=SystemActor(via="bench"), owner=user, name=f"{name} {tag}", queues=[QUEUE], rps=0
        )[0]

    plain, named = vend("bench plain"), vend("bench named")
    limit_services.limit_set(actor=actor, kind="pool", name=pool, slots=ROOM)
    for t in tags:
        limit_services.limit_set(actor=actor, kind="tag", name=t, limit=ROOM)
    names: dict[str, Any] = {"pool": pool, "tags": tags}
    points: dict[str, list[dict[str, Any]]] = {"plain": [], "named": []}
    ratio_runs: list[float] = []
    guess = _INITIAL_RATE_GUESS
    try:
        for _ in range(repeats):
            unnamed = _measure(plain, CLAIMERS, duration_s, guess, [QUEUE])
            with_names = _measure(named, CLAIMERS, duration_s, guess, [QUEUE], **names)
            points["plain"].append(unnamed)
            points["named"].append(with_names)
            guess = max(guess, unnamed["rate"], with_names["rate"])
            if unnamed["rate"]:
                ratio_runs.append(with_names["rate"] / unnamed["rate"])
    finally:
        Endpoint.objects.filter(pk__in=[plain.pk, named.pk]).delete()
        for kind, name in (("pool", pool), *(("tag", t) for t in tags)):
            limit_services.limit_delete(actor=actor, kind=kind, name=name)
        user.delete()
    ratio = summary(ratio_runs)
    return {
        "bench": "limits",
        "duration_s": duration_s,
        "repeats": repeats,
        "claimers": CLAIMERS,
        "unit": "claim+complete cycles per second",
        "scenario": "named: every todo names one pool and two tags (enforce, never full)",
        "rates": {label: summary([p["rate"] for p in runs]) for label, runs in points.items()},
        "ratios": {"named_vs_plain_at_8": ratio},
        "targets": {"named_vs_plain_at_8": TARGET_NAMED_VS_PLAIN_AT_8},
        "met": {"named_vs_plain_at_8": ratio["median"] >= TARGET_NAMED_VS_PLAIN_AT_8},
        "points": points,
    }
