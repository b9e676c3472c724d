"""A long-lived child process for the named-limits state machine (test_state_machine.py).

Usage: python -m tests.limits.machine_racer
Environment: DATABASE_URL (the test database), REDIS_URL, DJANGO_SETTINGS_MODULE.
Prints "ready", then for each JSON command line on stdin ({"endpoint": id, "claims": [...]},
each claim either "next" for claim_next or a todo id for a claim by id) makes those claims one
after another on its own database connection and prints one JSON line: {"results": [...],
"errors": [...]}, a result being {"claimed": todo id, "attempt": n}, {"refused": error class}
or {"empty": n deferred}. The parent writes to two of these at once, so their claims race.
"""

from __future__ import annotations

from typing import Any

from tests.child_serve import serve

# A lease no test step outlives: a claim never lapses by itself, only through the machine's
# expire rule.
LEASE_TTL_SECONDS = 3600


def run(command: dict[str, Any]) -> dict[str, Any]:
    from queues import services
    from queues.access import AgentActor
    from queues.models import Endpoint
    from switchboard.core.errors import DomainError

    actor = AgentActor(Endpoint.objects.get(pk=command["endpoint"]))
    results: list[dict[str, Any]] = []
    errors: list[str] = []
    for target in command["claims"]:
        try:
            if target == "next":
                got: Any = services.claim_next(actor=actor, lease_ttl_seconds=LEASE_TTL_SECONDS)
            else:
                got = services.claim(
                    actor=actor, todo_id=target, lease_ttl_seconds=LEASE_TTL_SECONDS
                )
        except DomainError as refused:  # deferred by a gate, or taken by the other claimer
            results.append({"refused": type(refused).__name__})
            continue
        except Exception as exc:  # reported to the parent, which fails the step
            errors.append(repr(exc))
            continue
        if isinstance(got, services.Claimed):
            results.append({"claimed": str(got.todo.id), "attempt": got.attempt})
        else:
            results.append({"empty": len(got.deferred)})
    return {"results": results, "errors": errors}


if __name__ == "__main__":
    serve(run)
