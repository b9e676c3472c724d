"""The fleet's reads on the todo tables (``queues.activity``): the throughput chart's attempts per
queue and minute, and what each endpoint holds now."""

from __future__ import annotations

# One grouped read of the attempts that began or ended in the window (attempt_claimed_brin and
# attempt_ended_brin find them without reading older attempts), per queue, kind and minute. A
# claim still in progress has no Attempt row yet (it is written when the claim ends): its claim
# is the todo's claimed_at (todo_claimed_idx).
THROUGHPUT_SQL = """
SELECT t.queue, x.kind, date_trunc('minute', x.at) AS minute, count(*)
FROM (
    SELECT a.todo_id, 'claims' AS kind, a.claimed_at AS at
    FROM queues_attempt a
    WHERE a.claimed_at >= %(since)s AND a.endpoint_id = ANY(%(endpoints)s)
    UNION ALL
    SELECT c.id, 'claims', c.claimed_at
    FROM queues_todo c
    WHERE c.state = 'claimed' AND c.claimed_at >= %(since)s AND c.endpoint_id = ANY(%(endpoints)s)
    UNION ALL
    SELECT a.todo_id, CASE a.outcome WHEN 'completed' THEN 'completions' ELSE 'failures' END,
           a.ended_at
    FROM queues_attempt a
    WHERE a.ended_at >= %(since)s AND a.outcome IN ('completed', 'failed')
      AND a.endpoint_id = ANY(%(endpoints)s)
) x JOIN queues_todo t ON t.id = x.todo_id
GROUP BY 1, 2, 3
"""

HELD_SQL = """
SELECT id FROM (
    SELECT t.id, row_number() OVER (PARTITION BY t.endpoint_id ORDER BY t.claimed_at, t.id) AS n
    FROM queues_todo t
    WHERE t.state = 'claimed' AND t.endpoint_id = ANY(%(endpoints)s)
) ranked WHERE n <= %(shown)s
"""

# Per endpoint, its claimed todos, and how many of them a person holds (claimed in the console:
# their owner is ``queues.access.HUMAN_PREFIX`` and a name, given as ``person``).
HOLDING_SQL = """
SELECT endpoint_id, count(*), count(*) FILTER (WHERE starts_with(owner, %(person)s))
FROM queues_todo
WHERE state = 'claimed' AND endpoint_id = ANY(%(endpoints)s)
GROUP BY endpoint_id
"""

# The board's card rows of the shown queue identities only: one array pair as the parameters
# (endpoint ids, queue names), not an OR of pairs, whose compiling cost more than the query.
SHOWN_IDENTITIES = (
    '("queues_todo"."endpoint_id", "queues_todo"."queue") IN '
    "(SELECT * FROM unnest(%s::uuid[], %s::text[]))"
)
