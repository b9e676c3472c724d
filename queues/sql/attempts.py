"""The Attempt row of a claim that ended, written by the statement that ends it.

A claim in progress is its todo's columns (``owner``, ``claimed_at``, ``lease_expires_at``,
``attempt``, ``lease_token_hash``, ``claim_via``; ``queues.models.Attempt``). Every statement
that ends one (complete, fail, release, the reaper, a quarantine's expiry, a revoke, a takeover)
returns the claim as it was with ``ENDED_CLAIM`` and inserts its row with ``ended_attempt``, in
the same statement. Imported by ``queues.sql`` and ``queues.sql.gated`` alike.
"""

from __future__ import annotations

# What a statement that ends a claim returns of it besides the todo's columns: the claim as it
# was, from the row version the statement locked and changed (``old``, PostgreSQL 18), so the
# Attempt row it writes is the claim that ended, whatever committed after its snapshot.
ENDED_CLAIM = (
    "old.attempt AS a_number, old.owner AS a_claimant, old.claim_via AS a_via,"
    " old.claimed_at AS a_claimed_at, old.lease_expires_at AS a_lease,"
    " old.lease_token_hash AS a_fence"
)
# The todo's claim columns once the claim ended: no claim in progress.
CLAIM_CLEARED = "lease_token_hash = NULL, claim_via = ''"


def ended_attempt(
    source: str,
    *,
    ended_at: str,
    outcome: str,
    disposition: str,
    summary: str = "''",
    error: str = "NULL",
    where: str = "",
) -> str:
    """The INSERT of the Attempt rows of the claims that the rows of ``source`` (aliased ``h``:
    ``id``, ``endpoint_id`` and ``ENDED_CLAIM``'s columns) ended. ``ended_at``, ``outcome``,
    ``disposition``, ``summary`` and ``error`` are SQL expressions over ``h``."""
    return f"""INSERT INTO queues_attempt (todo_id, number, endpoint_id, claimant, via, claimed_at,
        lease_expires_at, lease_token_hash, ended_at, outcome, disposition, summary, error)
    SELECT h.id, h.a_number, h.endpoint_id, h.a_claimant, h.a_via,
           coalesce(h.a_claimed_at, {ended_at}), coalesce(h.a_lease, {ended_at}), h.a_fence,
           {ended_at}, {outcome}, {disposition}, {summary}, {error}
    FROM {source} h{where}"""
