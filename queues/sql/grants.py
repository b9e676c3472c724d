"""Grants as ledger facts: the ``limits.grant`` row a claim through a named limit writes, and the
``limits.end`` row the statement ending such a claim writes, each inside the claim's (or the
end's) own statement through ``ledger_append_row`` (ledger migrations 0008 and 0009): the row
goes to one of the ledger's grant chains, the first whose lock is free
(``switchboard.ledger.chain`` explains the chains and why their ``seq`` order is causal).

A grant's identity is its row's ``entry_hash``, kept on the todo (``grant_hash``) while the claim
lasts. The chain's lock is taken inside the statement after every gate's lock (the verdicts, or
the locked path's admissions, come first; an ending statement's shared locks on the limits,
``admission.limits.locks``, come first too), so it is held only for the rest of that statement and its commit, and the lock
order stays policy, pool, tags, rate, ledger. The row's ``seq`` is drawn there too, after the
gates' locks: what the replay's order rests on.

The ``after`` objects are built here as canonical JSON text (keys sorted, no spaces, as
``switchboard.ledger.chain.canonical`` writes them): every value is a number, a uuid, a name
matching a name pattern, or text Python encoded (the holder), so no SQL escaping is involved.
"""

from __future__ import annotations

from switchboard.ledger import chain
from switchboard.ledger.models import LedgerKind

# The endpoint a todo row ``alias`` belongs to, as the ledger's scope.
_SCOPE = "(SELECT 'endpoint:' || e.slug FROM queues_endpoint e WHERE e.id = {alias}.endpoint_id)"


def grant_cte(items: str, condition: str = "") -> str:
    """The CTE ``grant_row`` (one column ``h``: the grant's entry_hash) over the candidate ``cand``
    (``id``, ``endpoint_id``, ``queue``, ``prev_attempt``, ``prev_grant``: the grant of the lapsed
    claim a takeover supersedes): a row only when ``items`` (SQL text:
    the canonical JSON items of the limits passed, comma-joined) is not empty and ``condition``
    (SQL, `` AND ...``) holds. The claim's UPDATE reads it, so it runs only for a claim written.
    Binds ``lg_holder`` (the claimant as a JSON string) and ``chain.row_params``."""
    after = (
        "'{\"attempt\":' || (c.prev_attempt + 1) || ',\"holder\":' || %(lg_holder)s"
        " || ',\"limits\":[' || gi.items || '],\"supersedes\":'"
        " || coalesce('\"' || c.prev_grant || '\"', 'null') || ',\"todo\":\"' || c.id || '\"}'"
    )
    append = chain.append_row_sql(
        LedgerKind.LIMITS_GRANT.value, scope=_SCOPE.format(alias="c"), queue="c.queue", after=after
    )
    return f"""grant_row AS MATERIALIZED (
    SELECT {append} AS h
    FROM cand c, (SELECT {items} AS items) gi
    WHERE gi.items <> ''{condition}
),"""


def end_cte(source: str, ended: str, name: str = "end_row") -> str:
    """The CTE ``name``: one ``limits.end`` row per row of ``source`` (a todo row with
    ``id``, ``endpoint_id``, ``queue``, ``attempt`` and ``ended_grant``, the grant it held) that
    ended a grant; ``ended`` is an SQL text expression (completed, failed, released,
    superseded)."""
    after = (
        '\'{"attempt":\' || d.attempt || \',"ended":"\' || '
        + ended
        + ' || \'","grant":"\' || d.ended_grant || \'","todo":"\' || d.id || \'"}\''
    )
    append = chain.append_row_sql(
        LedgerKind.LIMITS_END.value, scope=_SCOPE.format(alias="d"), queue="d.queue", after=after
    )
    return f"""{name} AS MATERIALIZED (
    SELECT {append} AS h FROM {source} d WHERE d.ended_grant IS NOT NULL
)"""


# A takeover that writes no grant of its own (the limits it named went ``off``, or no longer
# gate it) still ends the lapsed claim's grant, or the replay would count it held forever: the
# CTE ``superseded_end`` over the claim's ``claimed`` rows (``prev_grant``: the grant the
# candidate held). A takeover that writes a grant names the old one in its ``supersedes``.
SUPERSEDED_END = end_cte(
    "(SELECT cl.id, cl.endpoint_id, cl.queue, cl.prev_attempt AS attempt,"
    " cl.prev_grant AS ended_grant FROM claimed cl WHERE cl.grant_hash IS NULL)",
    "'superseded'",
    name="superseded_end",
)


def batch_end_cte(source: str, ended: str) -> str:
    """The CTE ``end_row``: one ``limits.end`` row naming every grant the rows of ``source``
    ended at once (the reaper's batch, a revoke), none if they ended none; ``ended`` is a word
    (expired, revoked)."""
    item = (
        '\'{"attempt":\' || d.attempt || \',"grant":"\' || d.ended_grant'
        ' || \'","todo":"\' || d.id || \'"}\''
    )
    after = (
        f"'{{\"ended\":\"{ended}\",\"grants\":[' || string_agg({item}, ',' ORDER BY d.id) || ']}}'"
    )
    append = chain.append_row_sql(LedgerKind.LIMITS_END.value, scope="''", queue="''", after=after)
    return f"""end_row AS MATERIALIZED (
    SELECT {append} AS h FROM {source} d WHERE d.ended_grant IS NOT NULL HAVING count(*) > 0
)"""
