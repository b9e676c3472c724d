"""The named limits' trail through the ledger: every declared limit (pool, tag limit, rate limit)
and every queue's priority settings against their last audited state.

Registered with the ledger from ``LimitsConfig.ready()``, as admission's budgets are
(``admission.audit``), so ``ledger verify`` and ``limits verify`` report a limit changed, made or
deleted outside the audited path (raw SQL, a stray migration). Before, a pool set to ``off``
in the database let claims through with no grant row and no finding in either check.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from admission.limits.models import QueueSettings
from admission.limits.services import KINDS, as_dict
from switchboard.ledger.chain import VerifyReport, differences
from switchboard.ledger.models import LedgerEntry, LedgerKind

LIMIT_KINDS = (LedgerKind.LIMITS_SET, LedgerKind.LIMITS_DELETE, LedgerKind.LIMITS_QUARANTINE)


@dataclass(frozen=True)
class LimitDrift:
    """A live declaration that differs from its last audited state, or an audited one gone.

    ``scope``: "limits" (a pool, tag or rate limit, named in ``queue`` as "pool gpu") or
    "queue" (a queue's priority settings, ``queue`` its name), as their ledger rows are scoped.
    The problems are the budgets' (``admission.audit.PolicyDrift``)."""

    scope: str
    queue: str
    problem: str
    detail: str
    seq: int | None
    # The declaration as a machine reads it: "pool", "tag", "rate" or "queue", and its name.
    kind: str = ""
    name: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "limit": f"{self.scope}/{self.queue}",
            "kind": self.kind,
            "name": self.name,
            "scope": self.scope,
            "queue": self.queue,
            "problem": self.problem,
            "detail": self.detail,
            "seq": self.seq,
        }


@dataclass
class _Audited:
    seq: int
    deleted: bool
    state: dict[str, Any] | None


def _key_of(row: LedgerEntry) -> tuple[tuple[str, str], _Audited] | None:
    """The declaration a limits row records, and its state after the row."""
    if row.kind == LedgerKind.LIMITS_QUEUE:
        state = row.after if isinstance(row.after, dict) else None
        if state is None:
            return None
        return ("queue", str(state.get("queue"))), _Audited(row.seq, False, state)
    if row.kind not in LIMIT_KINDS:
        return None
    after = row.after
    if row.kind == LedgerKind.LIMITS_QUARANTINE and isinstance(after, dict):
        after = after.get("limit")
    known = after if isinstance(after, dict) else row.before
    if not isinstance(known, dict):
        return None
    key = (str(known.get("kind")), str(known.get("name")))
    if row.kind == LedgerKind.LIMITS_DELETE:
        return key, _Audited(row.seq, True, None)
    return key, _Audited(row.seq, False, after if isinstance(after, dict) else None)


class LimitTrail:
    """The last limits.* row per declaration, as rows stream past."""

    def __init__(self) -> None:
        self.last: dict[tuple[str, str], _Audited] = {}

    def see(self, row: LedgerEntry) -> None:
        found = _key_of(row)
        if found is not None:
            self.last[found[0]] = found[1]

    def finish(self, report: VerifyReport) -> list[LimitDrift]:
        live: dict[tuple[str, str], dict[str, Any]] = {}
        for kind in KINDS.values():
            for row in kind.model.objects.all():  # type: ignore[attr-defined]
                state = as_dict(kind, row)
                live[(kind.name, state["name"])] = state
        for settings in QueueSettings.objects.all():
            live[("queue", settings.queue)] = {
                "queue": settings.queue,
                "priority": settings.priority,
                "aging_seconds": settings.aging_seconds,
            }
        report.policies += len(live)
        problems: list[LimitDrift] = []
        for key, state in sorted(live.items()):
            audited = self.last.get(key)
            scope, what = _named(key)
            if audited is None:
                problems.append(
                    LimitDrift(
                        scope,
                        what,
                        "no_create_row",
                        f"{what} is declared but the ledger never recorded it: it was written "
                        "outside the audited path",
                        None,
                        *key,
                    )
                )
            elif audited.deleted:
                problems.append(
                    LimitDrift(
                        scope,
                        what,
                        "exists_after_delete",
                        f"{what} is declared but its last audited row (seq {audited.seq}) "
                        "deleted it",
                        audited.seq,
                        *key,
                    )
                )
            elif audited.state != state:
                problems.append(
                    LimitDrift(
                        scope,
                        what,
                        "changed_outside_audit",
                        f"{what} differs from its last audited state (seq {audited.seq}): "
                        f"{differences(audited.state or {}, state)}",
                        audited.seq,
                        *key,
                    )
                )
        for key, audited in sorted(self.last.items()):
            if key in live or audited.deleted:
                continue
            scope, what = _named(key)
            problems.append(
                LimitDrift(
                    scope,
                    what,
                    "deleted_outside_audit",
                    f"{what} is gone but its last audited row (seq {audited.seq}) says it is "
                    "declared",
                    audited.seq,
                    *key,
                )
            )
        return problems


def _named(key: tuple[str, str]) -> tuple[str, str]:
    kind, name = key
    if kind == "queue":
        return "queue", name
    return "limits", f"{'rate limit' if kind == 'rate' else kind} {name}"
