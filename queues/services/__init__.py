"""Every write to endpoints, todos and attempts: one function per state change, by topic.

Called alike by the admin, the pages, the REST API, MCP, the CLI and the sweeps. Keyword-only
arguments; refusals are ``switchboard.core.errors.DomainError`` subclasses. Counters and
notifications happen only after commit.

- ``endpoints``: vend, update, revoke an endpoint; create and revoke a personal token;
- ``todos``: intake, the transitions of a claimed todo, the operators' retry, release and
  discard, one todo at a time or a confirmed selection in bulk;
- ``claiming``: the claim, through every registered gate;
- ``sweeps``: lapsed leases and due retries.
"""

from __future__ import annotations

from queues.services.claiming import Claimed, NothingClaimable, claim, claim_next
from queues.services.doorbell_sweeps import remind_waiting, ring_stalled
from queues.services.endpoints import (
    endpoint_revoke,
    endpoint_rotate_hook_secret,
    endpoint_update,
    endpoint_vend,
    hook_secret_made,
    human_token_create,
    human_token_revoke,
    resolve_lease_ttl,
    touch_endpoint,
)
from queues.services.sweeps import reap_expired, record_sweep_run, requeue_due_retries, swept
from queues.services.todos import (
    BulkDone,
    TodoCreated,
    backoff_seconds,
    complete,
    fail,
    heartbeat,
    release,
    todo_create,
    todo_discard,
    todo_release,
    todo_retry,
    todos_bulk,
)
from switchboard.core.tokens import hash_token

__all__ = [
    "BulkDone",
    "Claimed",
    "NothingClaimable",
    "TodoCreated",
    "backoff_seconds",
    "claim",
    "claim_next",
    "complete",
    "endpoint_revoke",
    "endpoint_rotate_hook_secret",
    "endpoint_update",
    "endpoint_vend",
    "fail",
    "hash_token",
    "heartbeat",
    "hook_secret_made",
    "human_token_create",
    "human_token_revoke",
    "reap_expired",
    "record_sweep_run",
    "release",
    "remind_waiting",
    "requeue_due_retries",
    "resolve_lease_ttl",
    "ring_stalled",
    "swept",
    "todo_create",
    "todo_discard",
    "todo_release",
    "todo_retry",
    "todos_bulk",
    "touch_endpoint",
]
