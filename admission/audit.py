"""Admission's trail through the ledger: every live policy against its last audited state.

Registered with the ledger from ``AdmissionConfig.ready()``, so ``chain.verify`` reports a policy
changed, created or deleted outside the audited path (the admin's raw SQL, a stray migration).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from admission.models import AdmissionPolicy
from admission.policy import audited_windows
from admission.selectors import policy_dict
from switchboard.ledger.chain import VerifyReport, differences
from switchboard.ledger.models import LedgerEntry, LedgerKind

POLICY_KINDS = (LedgerKind.POLICY_CREATE, LedgerKind.POLICY_UPDATE, LedgerKind.POLICY_DELETE)


@dataclass(frozen=True)
class PolicyDrift:
    """A live policy that differs from its last audited state, or an audited one that vanished.

    problem: ``changed_outside_audit`` (the live row differs from the last ``after``),
    ``no_create_row`` (a live policy the ledger never saw), ``exists_after_delete`` (the last row
    is a delete but the policy is live), ``deleted_outside_audit`` (the last row says it exists,
    but it does not).
    """

    scope: str
    queue: str
    endpoint_id: str
    problem: str
    detail: str
    seq: int | None  # the last audited row of this policy, if any

    def as_dict(self) -> dict[str, Any]:
        return {
            "policy": f"{self.scope}/{self.queue}",
            "scope": self.scope,
            "queue": self.queue,
            "endpoint_id": self.endpoint_id,
            "problem": self.problem,
            "detail": self.detail,
            "seq": self.seq,
        }


@dataclass
class _Audited:
    seq: int
    kind: str
    scope: str
    after: dict[str, Any] | None


class PolicyTrail:
    """The last policy.* row per queue identity (endpoint id, queue), as rows stream past."""

    def __init__(self) -> None:
        self.last: dict[tuple[str, str], _Audited] = {}

    def see(self, row: LedgerEntry) -> None:
        if row.kind not in POLICY_KINDS:
            return
        state = row.after if row.after is not None else row.before
        if not isinstance(state, dict):
            return
        key = (str(state.get("endpoint_id")), str(state.get("queue")))
        self.last[key] = _Audited(row.seq, row.kind, row.scope, row.after)

    def finish(self, report: VerifyReport) -> list[PolicyDrift]:
        return _drift(self, report)


def _drift(trail: PolicyTrail, report: VerifyReport) -> list[PolicyDrift]:
    problems: list[PolicyDrift] = []
    live = set()
    for policy in AdmissionPolicy.objects.select_related("endpoint").order_by(
        "endpoint_id", "queue"
    ):
        report.policies += 1
        key = (str(policy.endpoint_id), policy.queue)
        live.add(key)
        scope = f"endpoint:{policy.endpoint.slug}"
        audited = trail.last.get(key)
        current = policy_dict(policy)
        if audited is None:
            problems.append(
                PolicyDrift(
                    scope,
                    policy.queue,
                    key[0],
                    "no_create_row",
                    f"the policy on {scope}/{policy.queue} exists but the ledger never recorded "
                    "its creation: it was written outside the audited path",
                    None,
                )
            )
        elif audited.kind == LedgerKind.POLICY_DELETE:
            problems.append(
                PolicyDrift(
                    scope,
                    policy.queue,
                    key[0],
                    "exists_after_delete",
                    f"the policy on {scope}/{policy.queue} exists but its last audited row "
                    f"(seq {audited.seq}) deleted it",
                    audited.seq,
                )
            )
        elif audited_windows(audited.after) != current:
            problems.append(
                PolicyDrift(
                    scope,
                    policy.queue,
                    key[0],
                    "changed_outside_audit",
                    f"the policy on {scope}/{policy.queue} differs from its last audited state "
                    f"(seq {audited.seq}): "
                    f"{differences(audited_windows(audited.after) or {}, current)}",
                    audited.seq,
                )
            )
    for key, audited in sorted(trail.last.items()):
        if key in live or audited.kind == LedgerKind.POLICY_DELETE:
            continue
        problems.append(
            PolicyDrift(
                audited.scope,
                key[1],
                key[0],
                "deleted_outside_audit",
                f"the policy on {audited.scope}/{key[1]} is gone but its last audited row "
                f"(seq {audited.seq}, {audited.kind}) says it exists",
                audited.seq,
            )
        )
    return problems
