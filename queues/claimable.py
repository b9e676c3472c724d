"""The one claimable rule, as SQL over a todo row ``t``: used by every claim statement and by
every reader that asks "is there work a claim could take now" (admission's reopen sweep).

A todo is claimable when it is pending, or claimed with a lapsed lease (a takeover), or failed
with its retry due, each with attempts left; never in the quarantine queue; never in a paused
queue (the claim statements check the pause inside the statement that locks the row).
"""

from __future__ import annotations

# The state arms of "claimable": pending, a lapsed lease (a takeover) or a due retry, each with
# attempts left.
CLAIMABLE_STATE = """
    (
        (t.state = 'pending' AND t.attempt < t.max_attempts)
        OR (t.state = 'claimed' AND t.lease_expires_at <= now() AND t.attempt < t.max_attempts)
        OR (t.state = 'failed' AND t.next_retry_at <= now() AND t.attempt < t.max_attempts)
    )
"""

# The whole rule for a reader: the state arms, not quarantine, not paused.
CLAIMABLE = f"""
    t.queue <> 'quarantine'
    AND {CLAIMABLE_STATE}
    AND NOT EXISTS (SELECT 1 FROM queues_queuepause qp WHERE qp.queue = t.queue)
"""
