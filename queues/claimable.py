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

# What a claim whose lease lapsed becomes (the SET list of an UPDATE over the todo row ``t``):
# back to pending with its attempts left, dead-lettered (failed, lease_expired) at the cap. The
# reaper and a quarantine's expiry both write it. The claim's grant (``grant_hash``) ends with it.
LAPSED_CLAIM_SET = """state = CASE WHEN t.attempt < t.max_attempts THEN 'pending' ELSE 'failed' END,
        owner = '', lease_expires_at = NULL, next_retry_at = NULL, grant_hash = NULL,
        lease_token_hash = NULL, claim_via = '',
        result = CASE WHEN t.attempt < t.max_attempts THEN t.result
                      ELSE '{"error": "lease_expired"}'::jsonb END,
        finished_at = CASE WHEN t.attempt < t.max_attempts THEN NULL ELSE now() END,
        updated_at = now()"""
