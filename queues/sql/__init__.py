"""Every statement on the todo tables that is not a plain ORM call: the claim (raw SQL, because it
is the hot path), the transitions of a claimed todo, the sweeps and the revoke. The package's
other modules hold the rest: ``gated`` (the fragments admission's gates and reopen compose),
``push`` (the doorbell and the wakes) and ``activity`` (the fleet's reads). No other module
names the todo or attempt table (``tests/test_import_contract.py`` checks).

One predicate decides what is claimable on all three claim paths (claim_next, claim of one todo,
the board's claim): pending with attempts left, a claimed todo whose lease lapsed with attempts
left (a takeover), or a failed todo whose retry is due with attempts left; never the quarantine
queue; never a paused queue name, checked inside the statement that locks the row.

The candidate statement also folds in each registered claim gate's probe (``queues.gates``) and
claims at once when no gate claims the candidate, so ungated work costs exactly one statement:
the same one it would cost if no gate existed, with the probes folded into it (admission's is one
lookup on the policy table's unique (endpoint_id, queue) index).
"""

from __future__ import annotations

import functools
import time
from asyncio import _get_running_loop as _running_loop
from contextlib import AbstractContextManager
from dataclasses import dataclass
from operator import is_
from typing import Any
from uuid import UUID

import psycopg
from django.db import DEFAULT_DB_ALIAS, connection, connections
from django.db.backends.utils import CursorWrapper
from django.db.models.base import ModelState
from django.db.models.signals import post_init, pre_init
from psycopg._queries import PostgresQuery, _query2pg_nocache
from psycopg.generators import execute as _pq_execute
from psycopg.pq import TransactionStatus
from psycopg.rows import tuple_row

from queues import gates
from queues.claimable import CLAIMABLE, CLAIMABLE_STATE, LAPSED_CLAIM_SET
from queues.models import Todo
from queues.sql import grants
from queues.sql.attempts import CLAIM_CLEARED, ENDED_CLAIM, ended_attempt
from switchboard.core import hotsettings
from switchboard.ledger import chain

# The columns of a todo no claim or transition answers: bookkeeping no surface shows of a todo
# (``queues.schemas.todo_out``) and no caller of the verbs reads afterwards. The Todo built from
# an answer has them deferred, read from the database only if asked (as ``.only()`` leaves
# them). Each answered column is read by libpq's row description, loaded by psycopg and set on
# the Todo, on every statement (issue 12: the claim cycle's client CPU).
_UNANSWERED = frozenset(
    {
        "idempotency_key",
        "source",
        "claimed_at",
        "finished_at",
        "rings",
        "rung_since",
        "stall_rung_at",
        "lease_token_hash",
        "claim_via",
        "retried_after",
    }
)
_TODO_FIELDS = [f for f in Todo._meta.concrete_fields if f.attname not in _UNANSWERED]
# The answered columns, in model order: what a claim or a transition returns of the todo.
TODO_COLUMNS = ", ".join(f"t.{f.column}" for f in _TODO_FIELDS)
CLAIMED_COLUMNS = ", ".join(f"cl.{f.column}" for f in _TODO_FIELDS)
DONE_COLUMNS = ", ".join(f"d.{f.column}" for f in _TODO_FIELDS)

# The queues a claim_next may draw from, computed inside the claiming statement (an InitPlan over
# the same snapshot): granted, not excluded by a refusal, not quarantine, not paused. Written as
# one array so the planner keeps its row estimate and walks todo_claimable_idx in order; as an
# anti-join per row it misjudges the pause table and sorts the whole backlog instead. The paused
# names are one array too (an InitPlan scanning the pause table once): as a NOT EXISTS per name the
# plan was a hash anti-join, whose hash table every execution built again (issue 12).
OPEN_QUEUES = """
    ARRAY(
        SELECT g FROM unnest(%(queues)s::text[]) g
        WHERE g <> 'quarantine' AND g <> ALL (%(excluded)s::text[])
          AND g <> ALL (ARRAY(SELECT qp.queue FROM queues_queuepause qp)::text[])
    )
"""

# What a claim writes: the todo's claim columns (every claim form; the full one adds the grant).
# The claim in progress is these columns; its Attempt row is written when it ends
# (``ended_attempt``). Plain text, no braces: safe inside a ``str.format`` template and an
# f-string alike.
_CLAIM_SET = """    SET state = 'claimed',
        attempt = t.attempt + 1,
        owner = %(claimant)s,
        claimed_at = clock_timestamp(),
        lease_expires_at = clock_timestamp() + make_interval(secs => %(ttl)s),
        lease_token_hash = %(fence_hash)s,
        claim_via = %(via)s,
        next_retry_at = NULL,
        updated_at = clock_timestamp()"""

# The claim itself, applied to a row this transaction already holds locked. A takeover also
# writes the Attempt row of the lapsed claim it replaces, in the same statement.
_CLAIM_CTES = (
    """
claimed AS (
    UPDATE queues_todo t
"""
    + _CLAIM_SET
    + """,
        grant_hash = {grant}
    FROM cand c
    WHERE t.id = c.id {admit}
    RETURNING {TODO_COLUMNS}, t.claimed_at, c.prev_state, c.prev_attempt, c.prev_grant,
              old.state AS a_state, """
    + ENDED_CLAIM
    + """
),
{supersede_end},
-- A takeover ends the lapsed claim it replaces: its Attempt row, from the row version this
-- statement locked (``old``), ended when the new claim began. The InitPlan runs superseded_end.
superseded AS (
    """
    + ended_attempt(
        "claimed",
        ended_at="h.claimed_at",
        outcome="'superseded'",
        disposition="'requeued'",
        where="\n    WHERE h.a_state = 'claimed' AND (SELECT count(*) FROM superseded_end) >= 0",
    )
    + """
)
"""
)


def _claim_ctes(admit: str, grant: str) -> str:
    return _CLAIM_CTES.format(
        admit=admit, grant=grant, TODO_COLUMNS=TODO_COLUMNS, supersede_end=grants.SUPERSEDED_END
    )


def _probes(gate_list: tuple[gates.ClaimGate, ...], alias: str) -> list[str]:
    return [f"{gate.probe(alias)} AS g{i}" for i, gate in enumerate(gate_list)]


def _fast_gates(gate_list: tuple[gates.ClaimGate, ...]) -> tuple[str, str, str, str]:
    """The fast path's CTEs for ``gate_list`` (see ``queues.gates``): one verdict per gate, in
    lock order, each evaluated only if the gate's probe claims the candidate and every earlier
    verdict admitted it, then the grant row the admitting verdicts name (``grants``); the
    claim's condition; the charges; the verdict columns."""
    verdicts, charges, spent = [], [], ["0"]
    admit = ""
    # A gate that cannot decide here (a rate limit) sends a candidate it claims to the
    # locked path, which decides every gate: no fast verdict is taken for that candidate.
    unclaimed = "".join(
        f" AND g.g{j} IS NULL"
        for j, gate in enumerate(gate_list)
        if gate.fast_check("", "", "") is None
    )
    for i, gate in enumerate(gate_list):
        check = gate.fast_check(f"g.g{i}", "g.id", f"%(gp{i})s")
        earlier = "".join(
            f" AND coalesce((SELECT (v->>'ok')::boolean FROM v{j}), true)" for j in range(i)
        )
        if check is None:
            verdict = "NULL::jsonb"
            admit += f" AND (SELECT g{i} FROM gate) IS NULL"
        else:
            verdict = f"CASE WHEN g.g{i} IS NOT NULL{unclaimed}{earlier} THEN {check} END"
            admit += f" AND coalesce((SELECT (v->>'ok')::boolean FROM v{i}), true)"
            # Referenced by the final select, so it runs; after `claimed`, so only for a claim.
            charges.append(
                f"charge{i} AS MATERIALIZED (SELECT {gate.fast_charge('x.v')} AS n "
                f"FROM v{i} x, claimed WHERE x.v IS NOT NULL)"
            )
            spent.append(f"(SELECT count(*) FROM charge{i})")
        verdicts.append(f"v{i} AS MATERIALIZED (SELECT {verdict} AS v FROM gate g),")
    columns = "".join(f"(SELECT v FROM v{i}), " for i in range(len(gate_list)))
    columns += " + ".join(spent) + ", "
    items = ", ".join(f"(SELECT v->>'grant' FROM v{i})" for i in range(len(gate_list)))
    verdicts.append(grants.grant_cte(f"concat_ws(',', {items})", admit))
    return "\n".join(verdicts), admit, ",\n".join(charges), columns


# The rows claim_next may take: the endpoint's claimable todos of the open queues (uses
# todo_claimable_idx, whose predicate is stated so the planner can use it).
_CLAIM_NEXT_ROWS = f"""
    t.endpoint_id = %(endpoint)s
      AND t.queue = ANY({OPEN_QUEUES})
      AND (t.state IN ('pending', 'claimed') OR (t.state = 'failed' AND t.next_retry_at IS NOT NULL))
      AND {CLAIMABLE_STATE}
"""


# claim_next: the oldest claimable todo of the endpoint's granted queues, skipping rows other
# claimers hold, rows this claim passed over after a per-todo refusal, and rows a per-todo gate
# would refuse now (its skip). Claims at once when no gate claims the candidate; otherwise
# returns the candidate (locked) and each gate's key, and the caller runs the gates. ``fast``:
# the gates that can decide inside this statement do (their verdicts follow the keys), and the
# claim is written when every verdict admits it. It always answers one row: with no candidate,
# whether some claimable todo was skipped (the caller then asks the gates why, for the deferred
# list).
@functools.cache
def _claim_next_sql(
    gate_list: tuple[gates.ClaimGate, ...],
    fast: bool = False,
    prioritised: bool = False,
    names: bool = False,
    bare: bool = False,
) -> str:
    """``bare``: no skips and no fast verdicts, and the candidate is claimed only when no gate's
    probe claims it; a gate's skip only passes over rows its probe claims, so the bare
    statement's candidate is the full statement's whenever it claims one (see claim_next).
    The bare statement is its own leaner form (``_bare_claim_sql``)."""
    if bare:
        return _bare_claim_sql(gate_list, prioritised, names)
    probe = admit = ""
    keys = charges = ""
    grant = "NULL"
    if gate_list:
        probe = (
            f"gate AS MATERIALIZED (SELECT c.id, {', '.join(_probes(gate_list, 'c'))} FROM cand c),"
        )
        held = " OR ".join(f"g{i} IS NOT NULL" for i in range(len(gate_list)))
        admit = f"AND NOT EXISTS (SELECT 1 FROM gate WHERE {held})"
        keys = "".join(f"(SELECT g{i} FROM gate), " for i in range(len(gate_list)))
        if fast and not bare:
            verdict_ctes, admit, charge_ctes, columns = _fast_gates(gate_list)
            probe += "\n" + verdict_ctes
            keys += columns
            grant = "(SELECT h FROM grant_row)"
            charges = ",\n" + charge_ctes if charge_ctes else ""
    skips = [] if bare else [f"({s})" for s in gates.skips("t")]
    passes = "".join(f"\n      AND {s} IS NOT TRUE" for s in skips)
    # The first statement of a claim_next (bare, or fast) has excluded no queue and passed no
    # todo yet: written as constants, it binds two arrays fewer (issue 12: Python per cycle).
    rows = _CLAIM_NEXT_ROWS
    if bare or fast:
        rows = rows.replace("%(excluded)s::text[]", "'{}'::text[]")
    else:
        passes = "\n      AND t.id <> ALL(%(passed)s::uuid[])" + passes
    # Only read when there is no candidate (CASE), so a claim never pays for it.
    skipped = (
        f"CASE WHEN c.id IS NULL THEN EXISTS (SELECT 1 FROM queues_todo t "
        f"WHERE {rows} AND ({' OR '.join(skips)})) ELSE false END"
        if skips
        else "false"
    )
    # Oldest first (todo_claimable_idx gives the order); with a queue priority (queues.gates),
    # the highest score first, then oldest: that sorts the candidate rows, so it is used only
    # when a priority applies to these queues.
    order = "t.created_at, t.id"
    if prioritised:
        order = f"{gates.priority_score('t')} DESC, {order}"
    # Now and then the statement also carries back which queue names have a priority, so the
    # claim never spends a statement of its own on that (queues.gates.Priority).
    names_column = f"{gates.priority_names_sql()}, " if names else ""
    return _compact(f"""
WITH cand AS (
    -- What the gates' probes may read: the identity and the named limits (admission.limits).
    SELECT t.id, t.state AS prev_state, t.attempt AS prev_attempt, t.endpoint_id, t.queue,
           t.pool, t.tags, t.rate_limit, t.grant_hash AS prev_grant
    FROM queues_todo t
    WHERE {rows}{passes}
    ORDER BY {order}
    LIMIT 1
    FOR UPDATE OF t SKIP LOCKED
),
{probe}
{_claim_ctes(admit, grant)}{charges}
SELECT c.id, c.queue, {skipped}, {names_column}{keys}cl.id IS NOT NULL, {CLAIMED_COLUMNS}
FROM (SELECT) one LEFT JOIN cand c ON true LEFT JOIN claimed cl ON cl.id = c.id
""")


def _first_candidate(prioritised: bool) -> str:
    """The ``cand`` CTE of claim_next's first statements (the bare one and the lean one): the
    oldest claimable todo of the open queues (the highest priority first when one applies),
    locked, skipping rows others hold; nothing excluded or passed yet. One text for both, so
    their candidate is one row whichever of them runs."""
    order = "t.created_at, t.id"
    if prioritised:
        order = f"{gates.priority_score('t')} DESC, {order}"
    rows = _CLAIM_NEXT_ROWS.replace("%(excluded)s::text[]", "'{}'::text[]")
    return f"""cand AS (
    SELECT t.id, t.state AS prev_state, t.endpoint_id, t.queue, t.pool, t.tags, t.rate_limit,
           t.grant_hash AS prev_grant
    FROM queues_todo t
    WHERE {rows}
    ORDER BY {order}
    LIMIT 1
    FOR UPDATE OF t SKIP LOCKED
)"""


@functools.cache
def _bare_claim_sql(
    gate_list: tuple[gates.ClaimGate, ...], prioritised: bool = False, names: bool = False
) -> str:
    """claim_next's first statement for an endpoint that met no gated work lately: the oldest
    claimable todo, claimed only if it is plain (no gate's probe claims it) and no takeover
    (it was not claimed, so no lapsed attempt to close and no grant to end). Anything else it
    answers unclaimed, unlocked once it commits, and the full statement decides (``held``:
    some gate claims it). It carries no gate CTE, no verdict, no takeover CTE, no grant or
    ledger parameter and returns no gate keys: each is a plan node whose executor state
    PostgreSQL builds on every execution, run or not (issue 12: the core cycle's backend CPU).
    The same rows as the full statement whenever it claims one (``tests/queues``).

    The answer carries only the todo's columns this claim did not set to a value known before
    it ran (``_BARE_KNOWN``; the caller fills those in, ``_bare_todo``): each column is a
    column of the RETURNING, of two CTE scans and of the final projection, set up on every
    claim. ``held`` is NULL exactly when it claimed.

    The claim finds the candidate by its id, an InitPlan over ``cand``, and reads the
    conditions from the row it updates: no join of the two to set up. That row is the one
    ``cand`` locked, with the same values; only when another transaction changed it between
    this statement's snapshot and the lock are the conditions first read on the snapshot's
    version (then again on the locked one, as any UPDATE rechecks): a candidate that was a
    lapsed claim there and is plain now is left unclaimed, held, and the next statement of
    the same claim_next claims it.

    ``held`` is read from the candidate alone: one it left that is no takeover and holds no
    grant failed only the gates' probes, so some gate claims it; a takeover or a grant is left
    for the full statement, unheld, whether a gate claims it or not. The probes again in the
    answer would be a sub-plan per gate (an index scan) to set up on every claim, never run
    when it claims."""
    plain = "".join(f" AND {gate.probe('t')} IS NULL" for gate in gate_list)
    held = "c.prev_state <> 'claimed' AND c.prev_grant IS NULL" if gate_list else "false"
    names_column = f"{gates.priority_names_sql()}, " if names else ""
    # No row when there is no candidate, unless the row carries the priority names (then one
    # row always, as they must be read): a Result and a join fewer to set up on every claim.
    candidate = "(SELECT) one LEFT JOIN cand c ON true" if names else "cand c"
    return _compact(f"""
WITH {_first_candidate(prioritised)},
claimed AS (
    UPDATE queues_todo t
{_CLAIM_SET}
    WHERE t.id = (SELECT c.id FROM cand c)
      AND t.state <> 'claimed' AND t.grant_hash IS NULL{plain}
    RETURNING t.id, {_BARE_RETURNED}, t.claimed_at
)
SELECT c.id, c.queue, {names_column}CASE WHEN cl.id IS NULL THEN {held} END, {_BARE_ANSWERED}
FROM {candidate} LEFT JOIN claimed cl ON true
""")


@functools.cache
def _lean_gates(gate_list: tuple[gates.ClaimGate, ...]) -> tuple[int, ...]:
    """The gate the lean statement decides itself (``_lean_claim_sql``): one that holds a whole
    queue identity (not ``per_todo``: no skip, no limit a todo names, so no grant row) and can
    decide and charge inside the statement in one call (``fast_admit``). Admission's budget is
    one. With none, or more than one (the first would charge before the next decides), no lean
    statement: the full statement decides."""
    lean = tuple(
        i
        for i, gate in enumerate(gate_list)
        if not gate.per_todo and gate.fast_admit("", "", "") is not None
    )
    return lean if len(lean) == 1 else ()


@functools.cache
def _lean_claim_sql(
    gate_list: tuple[gates.ClaimGate, ...], prioritised: bool = False, names: bool = False
) -> str:
    """claim_next's statement for an endpoint whose claims met gated work lately (a budgeted
    queue): the bare statement's candidate, decided and charged by the gate that holds whole
    queue identities (``_lean_gates``) in one call inside the statement (``fast_admit``: the
    full statement's verdict, same function and parameters, and its charge), then the claim and
    its attempt row. It takes only a candidate that is no takeover, holds no grant and that no
    other gate's probe claims (no pool, tag or rate limit): then the full statement's skips,
    grant row, superseded-attempt and superseded-grant steps would all be empty, and its
    candidate is this one (a per-todo gate's skip only passes over rows that gate's probe
    claims). Such a candidate is locked, so once the verdict admits, the claim is certain: the
    charge need not wait for the claim row. Anything else it answers "not mine" (``mine``
    false: unclaimed, no verdict taken, unlocked once it commits) and the full statement
    decides. A verdict that does not admit charges nothing and leaves the candidate unclaimed,
    as the full statement would, and the caller takes the locked path.

    Each plan node is executor set-up on every execution, run or not (issue 12): the full
    statement carries some sixty (the gate and verdict CTEs of every gate, the grant row, the
    takeover's two CTEs, the skips and the "anything skipped" sub-select); this one the bare
    statement's and one CTE for the gate's verdict. No identity gate's verdict carries a grant
    (grants name the limits a todo names: ``queues.gates.Admission.granted``)."""
    (i,) = _lean_gates(gate_list)
    plain = "".join(f" AND {gate.probe('c')} IS NULL" for n, gate in enumerate(gate_list) if n != i)
    admit = gate_list[i].fast_admit(gate_list[i].probe("c"), "c.id", f"%(gp{i})s")
    names_column = f"{gates.priority_names_sql()}, " if names else ""
    return _compact(f"""
WITH {_first_candidate(prioritised)},
-- One row when the candidate is this statement's (see the docstring), with the gate's verdict,
-- charged when it admits (NULL: the gate's probe does not claim the candidate).
gate AS MATERIALIZED (
    SELECT c.id, {admit} AS v FROM cand c
    WHERE c.prev_state <> 'claimed' AND c.prev_grant IS NULL{plain}
),
claimed AS (
    UPDATE queues_todo t
{_CLAIM_SET}
    FROM gate g
    WHERE t.id = g.id AND coalesce((g.v->>'ok')::boolean, true)
    RETURNING {TODO_COLUMNS}, t.claimed_at
)
SELECT c.id, c.queue, {names_column}g.id IS NOT NULL, c.prev_state = 'claimed', g.v,
       {CLAIMED_COLUMNS}
FROM (SELECT) one LEFT JOIN cand c ON true LEFT JOIN gate g ON true LEFT JOIN claimed cl ON true
""")


def _compact(statement: str) -> str:
    """``statement`` without comment lines and indentation: fewer bytes to send, parse and hash
    (the hot cursor keeps each one's conversion, ``_HotQuery``). No literal in these statements
    spans lines or starts a line."""
    lines = (line.strip() for line in statement.splitlines())
    return "\n".join(line for line in lines if line and not line.startswith("--"))


def claim_next_sql(*, fast: bool = False, prioritised: bool = False, bare: bool = False) -> str:
    return _claim_next_sql(gates.gates(), fast, prioritised, False, bare)


# claim of one todo: lock it (waiting for any other holder), and report what it is, whether its
# queue is paused and each gate's key. The caller decides and then runs CLAIM_ONE_SQL.
@functools.cache
def _lock_one_sql(gate_list: tuple[gates.ClaimGate, ...]) -> str:
    keys = "".join(f"{p}, " for p in _probes(gate_list, "t"))
    return f"""
SELECT t.id, t.queue, t.state, t.attempt, t.max_attempts, t.endpoint_id,
       (t.queue <> 'quarantine' AND {CLAIMABLE_STATE}) AS claimable,
       {keys}EXISTS (SELECT 1 FROM queues_queuepause qp WHERE qp.queue = t.queue) AS paused
FROM queues_todo t
WHERE t.id = %(todo)s AND t.endpoint_id = ANY(%(endpoints)s)
FOR UPDATE OF t
"""


# The claim of a row this transaction holds locked and has admitted, with its grant row when the
# gates name limits it passed (``%(grant_items)s``: their canonical JSON items, or NULL).
CLAIM_ONE_SQL = f"""
WITH cand AS (
    SELECT t.id, t.state AS prev_state, t.attempt AS prev_attempt, t.endpoint_id, t.queue,
           t.grant_hash AS prev_grant
    FROM queues_todo t WHERE t.id = %(todo)s
),
{grants.grant_cte("%(grant_items)s::text")}
{_claim_ctes("", "(SELECT h FROM grant_row)")}
SELECT cl.id, cl.queue, true, {CLAIMED_COLUMNS}
FROM claimed cl
"""


class _HotQuery(PostgresQuery):
    """psycopg's conversion of a statement (placeholders to ``$n``), kept for every hot
    statement: psycopg keeps it only for statements of at most 4,096 characters and parses a
    longer one again on every call, and the claim statement with its gates' verdicts (a
    budgeted claim's) is twice that: about a tenth of a budgeted claim's client CPU (issue 12)."""

    __slots__ = ()

    def convert(self, query: Any, vars: Any) -> None:
        if vars is None or not isinstance(query, str):
            super().convert(query, vars)
            return
        self.parsed(_parsed(query, self._tx.encoding))
        self.dump(vars)

    def parsed(self, parsed: Any) -> None:
        self.query, self._want_formats, self._order, self._parts = parsed


def _parsed(query: str, encoding: str) -> Any:
    key = (query, encoding)
    parsed = _converted.get(key)
    if parsed is None:
        parsed = _query2pg_nocache(query.encode(encoding), encoding)
        # The hot statements are a few dozen texts (built once each, functools.cache).
        if len(_converted) < 256:
            _converted[key] = parsed
    return parsed


_converted: dict[tuple[str, str], Any] = {}


# The types whose equal values psycopg dumps alike, so a parameter equal to the one a statement
# bound last time keeps its dumped form (a float is not one: 0.0 == -0.0; nor a datetime: the
# same instant in two zones).
_SAME_DUMP = frozenset({str, int, bool, bytes, UUID})
_UNKEPT = object()  # a value not kept (any other type): dumped again on every call


def _kept(value: Any) -> Any:
    """What a bound statement keeps of a parameter to recognise it next time: the value itself
    (immutable), a tuple copy of a list of such values, or ``_UNKEPT``."""
    kind = type(value)
    if value is None or kind in _SAME_DUMP:
        return value
    if kind is list and all(type(item) in _SAME_DUMP for item in value):
        return tuple(value)
    return _UNKEPT


def _unchanged(value: Any, kept: Any) -> bool:
    """Whether ``value`` dumps as the parameter ``kept`` (``_kept``) was dumped. (Two UUIDs
    compare as UUID's ``__eq__`` does, by their ``int``, without calling it.)"""
    if value is kept:
        return True  # None, or the same immutable object (``_UNKEPT`` is never a parameter)
    kind = type(value)
    if kind is list:
        if type(kept) is not tuple or len(value) != len(kept):
            return False
        if all(map(is_, value, kept)):
            return True  # the very items kept (immutable): one pass in C, no Python per item
        # Of equal lengths (checked above). No ``strict=``: zip parses keyword arguments on
        # every call, at about the cost of the rest of it.
        for a, b in zip(value, kept):  # noqa: B905
            if type(a) is not type(b) or (a.int != b.int if type(a) is UUID else a != b):
                return False
        return True
    if kind is not type(kept) or kind not in _SAME_DUMP:
        return False
    return bool(value.int == kept.int if kind is UUID else value == kept)


class _Bound:
    """A hot statement as this cursor last bound it: its conversion, the parameters it kept
    (``_kept``), and the query psycopg's ``dump`` made of them (``_HotQuery``: their dumped
    form, types and formats), handed out again while they are unchanged."""

    __slots__ = ("kept", "parsed", "query")

    def __init__(self, parsed: Any, kept: list[Any], query: _HotQuery) -> None:
        self.parsed = parsed
        self.kept = kept
        self.query = query


_IDLE = TransactionStatus.IDLE
_INTRANS = TransactionStatus.INTRANS
_TUPLES_OK = int(psycopg.pq.ExecStatus.TUPLES_OK)


class _HotCursor(psycopg.Cursor[Any]):
    _query_cls = _HotQuery
    # The statements this cursor has bound (``_Bound``), for the Transformer that dumped them.
    _bound: dict[str, _Bound] | None = None
    _bound_tx: Any = None

    def _start_query(self, query: Any = None) -> Any:
        # psycopg gives the cursor a new Transformer (empty dumper and loader caches) whenever
        # the statement is not the one it ran last; on the kept cursor the claim and the
        # completion alternate, so every statement paid for it (issue 12). The caches are per
        # adapted type and oid, nothing of one statement; psycopg itself replaces the
        # Transformer when the cursor's adapters change (``_loaders_changed``).
        if query is not None and self._last_query is not None:
            self._last_query = query
        return super()._start_query(query)

    def _bind(self, query: str, params: dict[str, Any]) -> _HotQuery:
        """``query`` converted and ``params`` dumped, as ``PostgresQuery.convert`` does, but
        dumping again only the parameters that changed since this cursor last bound the
        statement: a claimer binds the same endpoint, queues, claimant and grant parameters
        every time, and psycopg dumps a list (the queues, the endpoints) in Python (issue 12:
        the client's CPU per cycle). A parameter is reused only when it is unchanged in type
        and value (``_unchanged``), and only with the Transformer that dumped it."""
        tx = self._tx
        if self._bound_tx is not tx or self._bound is None:
            self._bound, self._bound_tx = {}, tx
        bound = self._bound.get(query)
        if bound is None:
            pgq = self._query_cls(tx)
            parsed = _parsed(query, tx.encoding)
            pgq.parsed(parsed)
            pgq.dump(params)
            kept = [_kept(params[name]) for name in pgq._order or ()]
            if len(self._bound) < 256:  # the hot statements: a few dozen texts, as above
                self._bound[query] = _Bound(parsed, kept, pgq)
            return pgq
        parsed = bound.parsed
        order = parsed[2] or ()
        kept = bound.kept
        changed: list[int] = []
        try:
            for i, name in enumerate(order):
                value = params[name]
                if value is not kept[i] and not _unchanged(value, kept[i]):
                    changed.append(i)
        except KeyError:
            pgq = self._query_cls(tx)
            pgq.parsed(parsed)
            pgq.dump(params)  # psycopg's error, naming the missing parameter
            return pgq
        if not changed:
            # The very query sent last time: psycopg reads a query it sends and changes none.
            return bound.query
        last: Any = bound.query  # dumped: its params and formats are sequences
        out, types, formats = list(last.params), list(last.types), list(last.formats)
        kept = list(kept)
        for i in changed:
            value = params[order[i]]
            if value is None:
                out[i], types[i], formats[i] = None, _none_oid(tx), psycopg.pq.Format.TEXT
            else:
                dumper = tx.get_dumper(value, parsed[1][i])
                out[i], types[i], formats[i] = dumper.dump(value), dumper.oid, dumper.format
            kept[i] = _kept(value)
        pgq = self._query_cls(tx)
        pgq.parsed(parsed)
        pgq.params, pgq.types, pgq.formats = out, tuple(types), formats
        self._bound[query] = _Bound(parsed, kept, pgq)
        return pgq

    def execute_prepared(self, query: str, params: dict[str, Any]) -> bool:
        """``execute(query, params)`` for a statement psycopg has already prepared on this
        connection, in one plain call: the send, the wait for the results and their
        selection, without the generators ``execute`` stacks around them (which cost a claim
        cycle's client more than the send and the wait themselves; issue 12). False, having
        sent nothing: a case this does not cover (not yet prepared, a transaction to begin, a
        pipeline); the caller then runs ``execute``. The steps are those of psycopg's
        ``_execute_gen`` for an already-prepared statement (pinned 3.3.9)."""
        conn = self._conn
        # Private attributes, not the properties that answer them (a Python call each).
        if self._last_query is None or conn._pipeline is not None or self._closed:
            return False
        pgconn = conn.pgconn
        status = pgconn.transaction_status
        if status != _INTRANS and (status != _IDLE or not conn._autocommit):
            return False  # psycopg would begin a transaction first, or raise
        with conn.lock:
            pgq = self._bind(query, params)
            # PrepareManager.get: prepared already, nothing to deallocate first.
            prepared = conn._prepared
            if prepared.prepare_threshold is None or prepared._to_flush:
                return False
            key = (pgq.query, pgq.types)
            name = prepared._names.get(key)
            if not name:
                return False
            self._reset()
            pgconn.send_query_prepared(
                name, pgq.params, param_formats=pgq.formats, result_format=self.format
            )
            self._query = pgq
            # PrepareManager.maybe_add_to_cache for a prepared statement: its place in the LRU.
            counts = prepared._counts
            if key in counts:
                counts[key] += 1
                counts.move_to_end(key)
            else:
                prepared._names.move_to_end(key)
            try:
                results = conn.wait(_pq_execute(pgconn))
            except psycopg.errors._NO_TRACEBACK as ex:
                raise ex.with_traceback(None) from None
            if len(results) == 1 and (res := results[0]).status == _TUPLES_OK:
                # _check_results and _set_results (execute's) for the one result with rows.
                self._results[:] = results
                self._iresult = 0
                self.pgresult = res
                self._tx.set_pgresult(res)
                self._pos = 0
                self._rowcount = res.ntuples
                self._statusmessage = res.command_status
                # tuple_row's row maker is ``tuple`` itself: no two calls to learn it.
                rf = self._row_factory
                self._make_row = tuple if rf is tuple_row else rf(self)
            else:
                self._check_results(results)
                self._set_results(results)
            self._last_query = query
        return True

    def fetchone(self) -> Any:
        """psycopg's fetchone, in one call when a result with rows is selected (the claim's and
        the completion's); anything else (no result, a closed cursor, a pipeline) goes through
        psycopg's own, which raises as it does."""
        res = self.pgresult
        if res is None or self._closed or self._conn._pipeline is not None:
            return super().fetchone()
        if res.status != _TUPLES_OK:
            return super().fetchone()
        if self._pos < res.ntuples:
            record = self._tx.load_row(self._pos, self._make_row)
            self._pos += 1
            return record
        return None


def _none_oid(tx: Any) -> int:
    """The type psycopg binds a None parameter as (``Transformer._get_none_oid``)."""
    return int(tx.adapters.get_dumper(type(None), psycopg.adapt.PyFormat.TEXT).oid)


class _HotWrapper(CursorWrapper):
    """Django's CursorWrapper, its execute going the short way (``execute_prepared``) when no
    execute wrapper is installed; with one, the usual way, so wrappers see every statement."""

    # Django's translation of a driver's error (``with db.wrap_database_errors``: two calls on
    # every statement, issue 12) is entered only once an error is raised; it acts on errors
    # alone, so it translates them and sets the connection's flags as it always did.

    def execute(self, sql: Any, params: Any = None) -> Any:
        db = self.db
        if type(params) is dict and not db.execute_wrappers:
            if db.needs_rollback:
                db.validate_no_broken_transaction()  # raises
            # Read once: every attribute read on a CursorWrapper goes through its __getattr__
            # hook, unspecialised (issue 12).
            cursor = self.cursor
            try:
                if cursor.execute_prepared(sql, params):
                    return cursor
            except Exception:
                with db.wrap_database_errors:
                    raise
        return super().execute(sql, params)

    def fetchone(self) -> Any:
        # What CursorWrapper.__getattr__ hands out for fetchone, without building the wrapping
        # closure on every call.
        try:
            return self.cursor.fetchone()
        except Exception:
            with self.db.wrap_database_errors:
                raise


class _Lent:
    """``hot_cursor``'s context: the connection's kept cursor lent out, or a nested use's own."""

    __slots__ = ("db", "lent", "raw")

    def __init__(self, db: Any) -> None:
        self.db = db

    def __enter__(self) -> CursorWrapper:
        db = self.db
        # ensure_connection is async_unsafe: called whenever there is no connection yet or an
        # event loop runs in this thread (where it raises as before); otherwise it does nothing.
        if db.connection is None or _running_loop() is not None:
            db.ensure_connection()
        # One psycopg cursor per connection, kept between statements: a new cursor builds its
        # adapters' dumper and loader caches again on every statement, which cost a claim
        # cycle about 0.1 ms of client CPU (issue 12). A nested use (the kept cursor is lent
        # out) gets a cursor of its own, so a statement never replaces results its caller has
        # not read.
        # The kept cursor comes with its wrapper (which holds nothing but the cursor and the
        # connection), so lending it out builds no object (twice per claim cycle; issue 12).
        kept: tuple[Any, _HotCursor, list[bool], _HotWrapper] | None = getattr(
            db, "_hot_cursor", None
        )
        if kept is not None and kept[0] is db.connection and not kept[1]._closed and not kept[2][0]:
            raw, lent, wrapper = kept[1], kept[2], kept[3]
        else:
            # Binary results: timestamps and uuids load without parsing text.
            raw = _HotCursor(db.connection)
            raw.format = psycopg.pq.Format.BINARY
            lent = [False]
            wrapper = _HotWrapper(raw, db)
            if kept is None or kept[0] is not db.connection or kept[1]._closed:
                db._hot_cursor = (db.connection, raw, lent, wrapper)
            else:
                lent = []  # a nested cursor of its own: closed on exit
        if lent:
            lent[0] = True
        self.raw, self.lent = raw, lent
        return wrapper

    def __exit__(self, *exc: object) -> None:
        if self.lent:
            self.lent[0] = False
        else:
            self.raw.close()


# The thread-local storage behind ``connections`` when it is asgiref's thread-critical Local
# (Django's ConnectionHandler; asgiref pinned), else None.
_LOCAL_CONNECTIONS: Any = getattr(connections, "_connections", None)
_THREAD_CONNECTIONS = (
    getattr(_LOCAL_CONNECTIONS, "_storage", None)
    if type(_LOCAL_CONNECTIONS).__name__ == "_ThreadCriticalLocal"
    else None
)


def default_connection() -> Any:
    """``connections[DEFAULT_DB_ALIAS]``, without the exception asgiref's Local raises and
    catches on every lookup in a thread with no event loop (``asyncio.get_running_loop``):
    there its storage is a plain ``threading.local``, read here directly. Each claim_next and
    each completion looks the connection up (issue 12). With an event loop running in this
    thread, or no connection made yet in it, Django's own lookup, as before."""
    if _THREAD_CONNECTIONS is not None and _running_loop() is None:
        db = getattr(_THREAD_CONNECTIONS, DEFAULT_DB_ALIAS, None)
        if db is not None:
            return db
    return connections[DEFAULT_DB_ALIAS]


def hot_cursor(db: Any = None) -> AbstractContextManager[CursorWrapper]:
    """A cursor for the hot statements: server-side binding, so psycopg prepares a statement it
    has run a few times on this connection and PostgreSQL stops re-planning it. Wrapped in
    Django's CursorWrapper so errors, execute wrappers and query counts behave as usual.
    ``db``: the default database's connection, when the caller holds it already (one lookup
    per verb: ``connections[...]`` goes through asgiref's Local on every call)."""
    return _Lent(default_connection() if db is None else db)


# Endpoints whose last claim_next met a policy skip the autocommit fast path for a while, so
# a gated queue does not pay for a probe it will discard. Only a performance hint: the
# statement itself always probes every gate.
_GATED_HINT_SECONDS = 10.0
_gated_until: dict[UUID, float] = {}


# Each asks an empty dict first: a UUID's hash is a Python call, and no endpoint of this process
# may have met gated work yet.
def recently_gated(endpoint_id: UUID) -> bool:
    return bool(_gated_until) and _gated_until.get(endpoint_id, 0.0) > time.monotonic()


def mark_gated(endpoint_id: UUID) -> None:
    _gated_until[endpoint_id] = time.monotonic() + _GATED_HINT_SECONDS


# Endpoints whose last bare claim statement met a candidate some gate claims go straight to the
# full statement for a while, so gated work does not pay a bare statement it will discard. A
# hint only, like the one above: the bare statement decides inside itself.
_limited_until: dict[UUID, float] = {}


def recently_limited(endpoint_id: UUID) -> bool:
    return bool(_limited_until) and _limited_until.get(endpoint_id, 0.0) > time.monotonic()


def mark_limited(endpoint_id: UUID) -> None:
    _limited_until[endpoint_id] = time.monotonic() + _GATED_HINT_SECONDS


# Endpoints whose last lean statement met a candidate naming a limit (a pool, tags, a rate
# limit) skip the lean statement for a while (``claim_next_lean``): a hint, like the two above.
_named_until: dict[UUID, float] = {}


def recently_named(endpoint_id: UUID) -> bool:
    return bool(_named_until) and _named_until.get(endpoint_id, 0.0) > time.monotonic()


def mark_named(endpoint_id: UUID) -> None:
    _named_until[endpoint_id] = time.monotonic() + _GATED_HINT_SECONDS


# Not frozen: a frozen dataclass sets each field through object.__setattr__ in Python, and the
# bare claim builds one per claim (issue 12). Nothing hashes or mutates a candidate.
@dataclass(slots=True)
class Candidate:
    """What a claim statement found: the claimed todo, or a locked candidate awaiting its gates."""

    todo_id: UUID
    queue: str
    keys: tuple[Any, ...]  # per gate, in lock order: what admit needs, or None (not gated)
    todo: Todo | None  # set when the statement claimed it
    # The fast path's verdicts, per gate (None: not asked); empty on the locked path.
    verdicts: tuple[dict[str, Any] | None, ...] = ()
    # The bare statement's answer for a candidate it left: some gate claims it (False: a
    # takeover, or a grant to end, which only the full statement writes). No keys there.
    held: bool = True

    @property
    def claimed(self) -> bool:
        return self.todo is not None


_TODO_ATTNAMES = [f.attname for f in _TODO_FIELDS]
_NFIELDS = len(_TODO_FIELDS)
# The answered columns the bare claim fixes before it runs (``_bare_claim_sql``): the candidate's
# id and queue (answered first), the endpoint and claimant it binds, the state it sets, and the
# two it leaves NULL (it clears next_retry_at and claims no todo holding a grant).
_BARE_KNOWN = ("id", "endpoint_id", "queue", "state", "owner", "next_retry_at", "grant_hash")
_BARE_FIELDS = [f.column for f in _TODO_FIELDS if f.attname not in _BARE_KNOWN]
_BARE_RETURNED = ", ".join(f"t.{c}" for c in _BARE_FIELDS)
_BARE_ANSWERED = ", ".join(f"cl.{c}" for c in _BARE_FIELDS)
# _bare_todo's order, written out (it runs once per claim): the model's answered fields.
if _TODO_ATTNAMES != [
    "id", "endpoint_id", "queue", "title", "kind", "payload", "state", "owner",
    "lease_expires_at", "attempt", "max_attempts", "next_retry_at", "result", "created_at",
    "updated_at", "pool", "tags", "rate_limit", "grant_hash",
]:  # fmt: skip
    raise ImportError("queues.sql._bare_todo: the todo's answered fields changed")


def _bare_todo(
    todo_id: UUID, endpoint_id: UUID, queue: str, claimant: str, rest: tuple[Any, ...]
) -> Todo:
    """The Todo the bare claim claimed, from its answer's columns (``rest``, ``_BARE_FIELDS``)
    and the values it fixed (``_BARE_KNOWN``)."""
    return todo_from_row(
        (
            todo_id,
            endpoint_id,
            queue,
            *rest[:3],
            "claimed",
            claimant,
            *rest[3:6],
            None,
            *rest[6:],
            None,
        )
    )


# A transition's answer: the todo's answered columns, then what the claim's end frees
# (``gates.reopens``); a statement may carry more columns after those, which no caller reads.
NFIELDS = _NFIELDS
# Fields whose database value needs Django's converter: JSON arrives as text from Django's own
# cursors and already decoded from a binary hot cursor.
_CONVERTED = [i for i, f in enumerate(_TODO_FIELDS) if hasattr(f, "from_db_value")]
# A value such a field gets as text; a tuple, not ``str | bytes | bytearray``, which builds a
# union object on every evaluation (twice per claim cycle; issue 12).
_TEXT = (str, bytes, bytearray)


def todo_from_row(values: tuple[Any, ...] | list[Any]) -> Todo:
    """A Todo from a raw row in TODO_COLUMNS order, with the fields' database converters applied;
    the fields no statement answers (``_UNANSWERED``) are deferred."""
    if len(values) != _NFIELDS:
        raise ValueError(f"expected {_NFIELDS} todo columns, got {len(values)}")
    for i in _CONVERTED:
        if isinstance(values[i], _TEXT):
            # Text from one of Django's own cursors (a hot cursor's binary rows arrive decoded).
            values = list(values)
            for j in _CONVERTED:
                if isinstance(values[j], _TEXT):
                    values[j] = _TODO_FIELDS[j].from_db_value(values[j], None, connection)  # type: ignore[attr-defined]
            break
    # Any receiver at all (rarely): ask the signals about Todo, as Model.from_db would.
    if (pre_init.receivers or post_init.receivers) and (
        pre_init.has_listeners(Todo) or post_init.has_listeners(Todo)
    ):
        return Todo.from_db(DEFAULT_DB_ALIAS, _TODO_ATTNAMES, list(values))
    # What Model.from_db builds (the answered fields set, the others deferred: absent from
    # __dict__; loaded from this database), without its __init__'s per-field descriptor calls:
    # twice per claim cycle. As unpickling does.
    todo = Todo.__new__(Todo)
    # The lengths are equal (checked above). No ``strict=``: zip's check costs every item, and
    # any keyword argument is parsed on every call, at about the cost of the rest of zip.
    todo.__dict__.update(zip(_TODO_ATTNAMES, values))  # noqa: B905
    state = todo._state = ModelState()
    state.adding = False
    state.db = DEFAULT_DB_ALIAS
    return todo


@dataclass(frozen=True)
class NoCandidate:
    """claim_next's statement found nothing to take."""

    # Some claimable todo was passed over because a per-todo gate would refuse it now.
    skipped: bool


def _candidate(row: tuple[Any, ...] | None, nkeys: int, fast: bool = False) -> Candidate | None:
    if row is None or row[0] is None:
        return None
    todo_id, queue, *rest = row
    keys, rest = tuple(rest[:nkeys]), rest[nkeys:]
    verdicts: tuple[Any, ...] = ()
    if fast and nkeys:
        # The verdicts, then the number of charges (read only so that they run).
        verdicts, rest = tuple(rest[:nkeys]), rest[nkeys + 1 :]
    claimed, *columns = rest
    return Candidate(todo_id, queue, keys, todo_from_row(columns) if claimed else None, verdicts)


def claim_next_candidate(
    cursor: CursorWrapper,
    *,
    endpoint_id: UUID,
    queues: list[str],
    excluded: list[str],
    passed: list[UUID],
    claimant: str,
    via: str,
    ttl: int,
    fence_hash: str | None,
    fast: bool = False,
    prioritised: bool = False,
    bare: bool = False,
    ledger: dict[str, Any] | None = None,
) -> Candidate | NoCandidate:
    """The claim_next statement. ``excluded``: queues a gate refuses; ``passed``: todos a
    per-todo gate refused under its lock in this claim. ``fast``: gates that can decide inside
    it do (``queues.gates``), so an admitted gated claim is this one statement too, its grant
    row included (``ledger``: ``grant_params``, also for the end row of a superseded grant).
    ``bare``: claims the oldest claimable todo only if no gate claims it (else answers it
    unclaimed and unlocked at the statement's end): the plan carries no gate's skip or verdict."""
    fast = fast and not bare
    if (fast or bare) and (excluded or passed):
        raise ValueError("the bare and fast statements exclude no queue and pass no todo")
    if bare:
        return claim_bare(
            cursor,
            endpoint_id=endpoint_id,
            queues=queues,
            claimant=claimant,
            via=via,
            ttl=ttl,
            fence_hash=fence_hash,
            prioritised=prioritised,
        )
    gate_list = gates.gates()
    names = gates.priority_stale()
    params: dict[str, Any] = {
        "endpoint": endpoint_id,
        "queues": queues,
        "excluded": excluded,
        "passed": passed,
        "claimant": claimant,
        "via": via,
        "ttl": ttl,
        "fence_hash": fence_hash,
    }
    if fast:
        for i, gate in enumerate(gate_list):
            params[f"gp{i}"] = gate.fast_params(endpoint_id)
    # Bound on every full path: a takeover of a granted claim ends its grant (``superseded_end``).
    params.update(ledger or grant_params(None, ""))
    cursor.execute(_claim_next_sql(gate_list, fast, prioritised, names, bare), params)
    row = cursor.fetchone()
    assert row is not None, "the statement answers one row"
    if names:
        gates.priority_refresh(row[3])
        row = (*row[:3], *row[4:])
    skipped, row = row[2], (*row[:2], *row[3:])
    return _candidate(row, len(gate_list), fast) or NoCandidate(skipped=skipped)


def claim_bare(
    cursor: CursorWrapper,
    *,
    endpoint_id: UUID,
    queues: list[str],
    claimant: str,
    via: str,
    ttl: int,
    fence_hash: str | None,
    prioritised: bool = False,
) -> Candidate | NoCandidate:
    """``claim_next_candidate(bare=True)``: the bare statement, claim_next's first."""
    names = gates.priority_stale()
    return _bare_candidate(
        cursor,
        _bare_claim_sql(gates.gates(), prioritised, names),
        _first_params(endpoint_id, queues, claimant, via, ttl, fence_hash),
        names,
    )


def _first_params(
    endpoint_id: UUID, queues: list[str], claimant: str, via: str, ttl: int, fence_hash: str | None
) -> dict[str, Any]:
    """What claim_next's first statements (the bare and the lean one) bind besides the gates'
    parameters: their candidate's (``_first_candidate``) and their claim's."""
    return {
        "endpoint": endpoint_id,
        "queues": queues,
        "claimant": claimant,
        "via": via,
        "ttl": ttl,
        "fence_hash": fence_hash,
    }


def _bare_candidate(
    cursor: CursorWrapper, statement: str, params: dict[str, Any], names: bool
) -> Candidate | NoCandidate:
    """Run the bare statement (``_bare_claim_sql``): its row is the candidate's id and queue,
    the priority names when asked, whether a gate claims a candidate it left (NULL: it claimed
    it), the claimed todo's columns it did not fix (``_bare_todo``)."""
    cursor.execute(statement, params)
    row = cursor.fetchone()
    if row is None:
        return NoCandidate(skipped=False)  # it skips nothing: no todo is claimable now
    if names:
        gates.priority_refresh(row[2])
        row = (*row[:2], *row[3:])
    # Sliced, not star-unpacked (which builds a list item by item): once per claim.
    todo_id, queue, held = row[:3]
    if todo_id is None:
        return NoCandidate(skipped=False)  # the priority names' row, with no candidate
    if held is not None:
        return Candidate(todo_id, queue, (), None, held=held)
    todo = _bare_todo(todo_id, params["endpoint"], queue, params["claimant"], row[3:])
    return Candidate(todo_id, queue, (), todo, held=False)


def claim_next_lean(
    cursor: CursorWrapper,
    *,
    endpoint_id: UUID,
    queues: list[str],
    claimant: str,
    via: str,
    ttl: int,
    fence_hash: str | None,
    prioritised: bool = False,
) -> Candidate | NoCandidate | None:
    """The lean statement (``_lean_claim_sql``), for an endpoint that met gated work lately.
    None when its candidate is not the lean statement's (a takeover, a grant to end, a limit
    the todo names), or when no gate holds whole queue identities (nothing run): the full
    statement decides. A candidate naming a limit (or holding a grant) also sends this
    endpoint's next claims straight to the full statement for a while (``recently_named``), so
    named work does not pay a lean statement it will discard. Otherwise as the full fast
    statement answers: the claimed todo with the verdicts, a candidate a verdict did not admit
    (the locked path decides), or nothing claimable."""
    gate_list = gates.gates()
    lean = _lean_gates(gate_list)
    if not lean or recently_named(endpoint_id):
        return None
    names = gates.priority_stale()
    params = _first_params(endpoint_id, queues, claimant, via, ttl, fence_hash)
    for i in lean:
        params[f"gp{i}"] = gate_list[i].fast_params(endpoint_id)
    cursor.execute(_lean_claim_sql(gate_list, prioritised, names), params)
    row = cursor.fetchone()
    assert row is not None, "the statement answers one row"
    if names:
        gates.priority_refresh(row[2])
        row = (*row[:2], *row[3:])
    todo_id, queue, mine, takeover, *rest = row
    if todo_id is None:
        return NoCandidate(skipped=False)  # it skips nothing: no todo is claimable now
    if not mine:
        if not takeover:  # a limit the todo names, or a grant: named work
            mark_named(endpoint_id)
        return None
    verdicts: list[Any] = [None] * len(gate_list)
    verdicts[lean[0]], *columns = rest
    todo = todo_from_row(columns) if columns[0] is not None else None
    return Candidate(todo_id, queue, (), todo, tuple(verdicts))


@dataclass(frozen=True)
class LockedTodo:
    id: UUID
    queue: str
    state: str
    attempt: int
    max_attempts: int
    endpoint_id: UUID
    claimable: bool
    keys: tuple[Any, ...]  # per gate, as in Candidate
    paused: bool


def lock_one(
    cursor: CursorWrapper, *, todo_id: UUID, endpoint_ids: list[UUID]
) -> LockedTodo | None:
    cursor.execute(_lock_one_sql(gates.gates()), {"todo": todo_id, "endpoints": endpoint_ids})
    row = cursor.fetchone()
    if row is None:
        return None
    todo, queue, state, attempt, max_attempts, endpoint_id, claimable, *keys, paused = row
    return LockedTodo(
        todo, queue, state, attempt, max_attempts, endpoint_id, claimable, tuple(keys), paused
    )


def grant_params(actor: Any, claimant: str) -> dict[str, Any]:
    """What a claim statement binds for the grant row it may write (``grants.grant_cte``):
    ``actor`` a ``switchboard.ledger.chain.Actor``, or None when it writes none."""
    # Every claim and every ending binds these, and an agent's are the same each time: built
    # once per actor, claimant and ledger key (the HMAC pads derive from the key).
    return dict(_grant_params(actor, claimant, hotsettings.setting("LEDGER_KEY")))


def transition_params(
    params: dict[str, Any],
    *,
    todo_id: Any,
    endpoint_ids: list[Any],
    operator: bool,
    fence: str | None,
    attempt: int | None,
    ends: bool = False,
    ledger_actor: Any = None,
) -> dict[str, Any]:
    """What a transition statement (``complete_sql`` and the other endings) binds besides the
    verb's own ``params``: the todo, the endpoints it may act for, whether an operator acts, the
    lease's fence (its token's hash) and attempt; when it ``ends`` a claim, the grant
    parameters its end row may read, naming ``ledger_actor``."""
    bound = {
        **params,
        "id": todo_id,
        "endpoints": endpoint_ids,
        "operator": operator,
        "fence": fence,
        "attempt": attempt,
        "error": params.get("error"),
    }
    if ends:
        # grant_params'
        bound.update(_grant_params(ledger_actor, "", hotsettings.setting("LEDGER_KEY")))
    return bound


@functools.lru_cache(maxsize=1024)
def _grant_params(actor: Any, claimant: str, key: str) -> tuple[tuple[str, Any], ...]:
    return (*chain.row_params(actor).items(), ("lg_holder", chain.canonical_json(claimant)))


def claim_locked(
    cursor: CursorWrapper,
    *,
    todo_id: UUID,
    claimant: str,
    via: str,
    ttl: int,
    fence_hash: str | None,
    grant_items: str | None = None,
    ledger: dict[str, Any] | None = None,
) -> Candidate:
    """The claim of an admitted candidate; ``grant_items``: the canonical JSON items of the
    limits it passed (its grant row is written with ``ledger``, ``grant_params``)."""
    cursor.execute(
        CLAIM_ONE_SQL,
        {
            "todo": todo_id,
            "claimant": claimant,
            "via": via,
            "ttl": ttl,
            "fence_hash": fence_hash,
            "grant_items": grant_items,
            **(ledger or grant_params(None, claimant)),
        },
    )
    candidate = _candidate(cursor.fetchone(), 0)
    assert candidate is not None, "the claimed row was locked by this transaction"
    return candidate


# --- transitions of a claimed todo: each returns the todo's row and whether ending its claim
# frees a unit some gate limits. ---------------------------------------------------------------

# The caller holds the claim: the todo is claimed (its columns are the attempt in progress), the
# lease has not lapsed, and the caller names it. A fenced attempt needs its token; a token or an attempt number naming another
# attempt is a superseded holder. Operators (the console's actions) need neither token nor live
# lease, but an attempt they name (the one their page showed) must be the one in progress.
# The todo is found by its primary key: ``COLLATE "C"`` (the same equality: the database's
# collation is deterministic) keeps the planner from reading every claimed row of the endpoint
# through todo_claimed_idx, whose predicate a plain ``state = 'claimed'`` matches; with
# statistics taken while little was in flight, the prepared (generic) plan did that, and an
# ending's cost grew with the endpoint's claims in flight (issue 12;
# tests/queues/test_ending_plan.py).
HOLDS_CLAIM = """
    t.id = %(id)s AND t.endpoint_id = ANY(%(endpoints)s) AND t.state = 'claimed' COLLATE "C"
    AND (%(attempt)s::int IS NULL OR t.attempt = %(attempt)s::int)
    AND (%(operator)s OR (
        t.lease_expires_at > clock_timestamp()
        AND (t.lease_token_hash IS NOT DISTINCT FROM %(fence)s::text)))
"""


@functools.cache
def _heartbeat_sql(gate_list: tuple[gates.ClaimGate, ...]) -> str:
    return f"""
UPDATE queues_todo t
SET lease_expires_at = clock_timestamp() + make_interval(secs => %(ttl)s),
    updated_at = clock_timestamp()
WHERE {HOLDS_CLAIM} AND t.lease_expires_at > clock_timestamp()
RETURNING {TODO_COLUMNS}, NULL::text[]
"""


# The ended claim, read only once the attempt's update has run too (an unreferenced data-modifying
# CTE runs at the statement's end, which would put it under the chain's lock).
_AFTER_BOTH_WRITES = "(SELECT dd.* FROM done dd WHERE (SELECT count(*) FROM ended) >= 0)"


@functools.cache
def _ending_sql(
    gate_list: tuple[gates.ClaimGate, ...], todo_set: str, attempt_outcome: str, disposition: str
) -> str:
    """A claimed todo leaves the claim: set the todo's new state and close the attempt. A claim
    that held a grant ends it with a ``limits.end`` row (``grants.end_cte``), appended after the
    reopens' share locks on the limits were taken (the lock order of a claim) and after both
    rows are written, so the chain's lock is held for as little of the statement as it can be.

    The todo's UPDATE itself decides whether the caller holds the claim (``HOLDS_CLAIM`` is its
    WHERE), with no ``SELECT ... FOR UPDATE`` first: a row lock written to the WAL and a plan
    node on every ending (issue 12). Same answer: an UPDATE that meets a todo another
    transaction changed waits for it and evaluates its WHERE again on the new row, and nothing
    ends or replaces a todo's attempt without changing the todo's state or attempt, which
    ``HOLDS_CLAIM`` reads (the reaper, a revoke, a takeover, the other endings)."""
    return _compact(f"""
WITH done AS (
    UPDATE queues_todo t SET {todo_set}, grant_hash = NULL, {CLAIM_CLEARED},
        updated_at = clock_timestamp()
    WHERE {HOLDS_CLAIM}
    RETURNING {TODO_COLUMNS}, {gates.reopens("t")} AS reopens, old.grant_hash AS ended_grant,
              {ENDED_CLAIM}
), ended AS (
    {_ended(attempt_outcome, disposition)}
    RETURNING id
), {grants.end_cte(_AFTER_BOTH_WRITES, attempt_outcome)}
SELECT {DONE_COLUMNS}, d.reopens FROM done d WHERE (SELECT count(*) FROM end_row) >= 0
""")


@functools.cache
def _ending_plain_sql(
    gate_list: tuple[gates.ClaimGate, ...], todo_set: str, attempt_outcome: str, disposition: str
) -> str:
    """``_ending_sql`` for a claim that holds no grant (``t.grant_hash IS NULL`` in the todo's
    UPDATE): the same two writes and answer, without the ``limits.end`` row's CTE and the two
    aggregates that order it. A claim holds a grant only when a limit it names granted it (named
    todos), so most endings need neither; each is plan nodes and expressions PostgreSQL sets up
    on every execution, run or not (issue 12: the core cycle's backend CPU). A claim that holds
    a grant matches nothing here, and the caller runs ``_ending_sql`` (``ending_sqls``).

    Its answer is the todo's columns and the reopens, not ``done``'s whole row: the ended
    claim's six columns ``done`` carries for the attempt row would cost the client ~2.4 µs of
    decoding per completion, and the projection costs PostgreSQL nothing measurable
    (``bench.pg_instructions``: 1,158.9k against 1,157.0k per cycle)."""
    return _compact(f"""
WITH done AS (
    UPDATE queues_todo t SET {todo_set}, {CLAIM_CLEARED}, updated_at = clock_timestamp()
    WHERE {HOLDS_CLAIM} AND t.grant_hash IS NULL
    RETURNING {TODO_COLUMNS}, {gates.reopens("t")} AS reopens, {ENDED_CLAIM}
), ended AS (
    {_ended(attempt_outcome, disposition)}
)
SELECT {DONE_COLUMNS}, d.reopens FROM done d
""")


def _ended(outcome: str, disposition: str) -> str:
    """An ending's Attempt row, from ``done`` (the todo it changed, ``h``)."""
    return ended_attempt(
        "done",
        ended_at="clock_timestamp()",
        outcome=outcome,
        disposition=disposition,
        summary="%(summary)s",
        error="%(error)s",
    )


_COMPLETE = (
    "state = 'done', result = %(result)s, lease_expires_at = NULL, finished_at = clock_timestamp()",
    "'completed'",
    "'done'",
)

# At max_attempts a failure is final: a dead letter (failed with no next_retry_at).
_FAIL = (
    """state = 'failed', result = %(result)s, lease_expires_at = NULL,
       next_retry_at = CASE WHEN t.attempt < t.max_attempts
           THEN clock_timestamp() + make_interval(
               secs => LEAST(%(base)s * power(2, t.attempt - t.retried_after - 1), %(cap)s))
           ELSE NULL END,
       finished_at = CASE WHEN t.attempt < t.max_attempts THEN NULL ELSE clock_timestamp() END""",
    "'failed'",
    "CASE WHEN h.attempt < h.max_attempts THEN 'retry_scheduled' ELSE 'dead_lettered' END",
)

# Back to pending with the attempt unchanged and no backoff. A release of the last attempt has
# no attempt left to return to, so it dead-letters, as the reaper does at the cap.
_RELEASE = (
    """state = CASE WHEN t.attempt < t.max_attempts THEN 'pending' ELSE 'failed' END,
       owner = '', lease_expires_at = NULL,
       result = CASE WHEN t.attempt < t.max_attempts THEN t.result
                     ELSE '{"error": "attempts_exhausted"}'::jsonb END,
       finished_at = CASE WHEN t.attempt < t.max_attempts THEN NULL ELSE clock_timestamp() END""",
    "'released'",
    "CASE WHEN h.attempt < h.max_attempts THEN 'requeued' ELSE 'dead_lettered' END",
)


def heartbeat_sql() -> str:
    return _heartbeat_sql(gates.gates())


def complete_sql() -> str:
    return _ending_sql(gates.gates(), *_COMPLETE)


def complete_plain_sql() -> str:
    return _ending_plain_sql(gates.gates(), *_COMPLETE)


def fail_sql() -> str:
    return _ending_sql(gates.gates(), *_FAIL)


def release_sql() -> str:
    return _ending_sql(gates.gates(), *_RELEASE)


# --- sweeps ------------------------------------------------------------------------------------


# A lapsed claim's attempt: expired when the reaper took it back.
_REAPED_ATTEMPTS = ended_attempt(
    "reaped",
    ended_at="now()",
    outcome="'expired'",
    disposition="CASE WHEN h.state = 'pending' THEN 'requeued' ELSE 'dead_lettered' END",
)


@functools.cache
def _reap_sql(gate_list: tuple[gates.ClaimGate, ...]) -> str:
    """Lapsed claims back to pending (dead-lettered at the cap): per queue identity and new
    state, the count and the identities the freed claims may reopen (``gates.reopens``). The
    grants the batch ends are named by one ``limits.end`` row (``grants.batch_end_cte``)."""
    return f"""
WITH lapsed AS (
    SELECT t.id, t.grant_hash FROM queues_todo t
    WHERE t.state = 'claimed' AND t.lease_expires_at <= now()
    ORDER BY t.lease_expires_at
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
), reaped AS (
    UPDATE queues_todo t
    SET {LAPSED_CLAIM_SET}
    FROM lapsed l WHERE t.id = l.id
    RETURNING t.id, t.endpoint_id, t.queue, t.attempt, t.state, {gates.reopens("t")} AS reopens,
              l.grant_hash AS ended_grant, {ENDED_CLAIM}
), closed AS (
    {_REAPED_ATTEMPTS}
), {grants.batch_end_cte("reaped", "expired")}
SELECT r.endpoint_id, r.queue, r.state, count(DISTINCT r.id),
       coalesce(array_agg(DISTINCT k) FILTER (WHERE k IS NOT NULL), '{{}}')
FROM reaped r LEFT JOIN LATERAL unnest(r.reopens) k ON true
WHERE (SELECT count(*) FROM end_row) >= 0
GROUP BY r.endpoint_id, r.queue, r.state
"""


def reap_sql() -> str:
    return _reap_sql(gates.gates())


# The queue identities among ``%(keys)s`` (``<endpoint_id>:<queue>``) with a pending todo a claim
# could take now: claimable, and passed over by no per-todo gate's skip (a freed unit a racing
# claim took again reopens nothing).
@functools.cache
def _waiting_sql(gate_list: tuple[gates.ClaimGate, ...]) -> str:
    skips = " OR ".join(gates.skips("t")) or "false"
    return f"""
SELECT k FROM unnest(%(keys)s::text[]) k
WHERE EXISTS (SELECT 1 FROM queues_todo t
              WHERE t.endpoint_id = split_part(k, ':', 1)::uuid
                AND t.queue = substr(k, strpos(k, ':') + 1)
                AND t.state = 'pending' AND {CLAIMABLE} AND NOT ({skips}))
ORDER BY k
"""


def waiting_sql() -> str:
    return _waiting_sql(gates.gates())


REQUEUE_SQL = """
WITH due AS (
    SELECT t.id FROM queues_todo t
    WHERE t.state = 'failed' AND t.next_retry_at <= now()
    ORDER BY t.next_retry_at
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
), requeued AS (
    UPDATE queues_todo t SET state = 'pending', owner = '', next_retry_at = NULL, updated_at = now()
    FROM due d WHERE t.id = d.id
    RETURNING t.endpoint_id, t.queue
)
SELECT endpoint_id, queue, count(*) FROM requeued GROUP BY endpoint_id, queue
"""


# --- revoke ------------------------------------------------------------------------------------


# A revoked endpoint's live todos are dead-lettered with result endpoint_revoked; the open
# attempts close. Answers, per queue, the count and the queue identities (of other endpoints)
# the freed claims may reopen (``gates.reopens``, for the rows that were claimed).
# A revoked endpoint's claims in progress (its pending todos had none).
_REVOKED_ATTEMPTS = ended_attempt(
    "revoked",
    ended_at="now()",
    outcome="'revoked'",
    disposition="'dead_lettered'",
    where=" WHERE h.a_state = 'claimed'",
)


@functools.cache
def _revoke_sql(gate_list: tuple[gates.ClaimGate, ...]) -> str:
    return f"""
WITH live AS (
    SELECT t.id, t.state AS was, t.grant_hash FROM queues_todo t
    WHERE t.endpoint_id = %(endpoint)s
      AND (t.state IN ('pending', 'claimed')
           OR (t.state = 'failed' AND t.next_retry_at IS NOT NULL))
    ORDER BY t.id
    FOR UPDATE OF t
), revoked AS (
    UPDATE queues_todo t
    SET state = 'failed', next_retry_at = NULL, lease_expires_at = NULL, grant_hash = NULL,
        {CLAIM_CLEARED}, result = '{{"error": "endpoint_revoked"}}'::jsonb, finished_at = now(),
        updated_at = now()
    FROM live l WHERE t.id = l.id
    RETURNING t.id, t.endpoint_id, t.attempt, t.queue,
              CASE WHEN l.was = 'claimed' THEN {gates.reopens("t")} END AS reopens,
              l.grant_hash AS ended_grant, old.state AS a_state, {ENDED_CLAIM}
), closed AS (
    {_REVOKED_ATTEMPTS}
), {grants.batch_end_cte("revoked", "revoked")}
SELECT r.queue, count(DISTINCT r.id),
       coalesce(array_agg(DISTINCT k) FILTER (WHERE k IS NOT NULL), '{{}}')
FROM revoked r LEFT JOIN LATERAL unnest(r.reopens) k ON true
WHERE (SELECT count(*) FROM end_row) >= 0
GROUP BY r.queue
"""


def revoke_sql() -> str:
    return _revoke_sql(gates.gates())


# --- reads for the pages, the queue list and the resume -----------------------------------------

# The oldest pending todo of each endpoint on a queue: whom the resume rings, and which todo the
# ready hook names (uses todo_pending_idx).
OLDEST_PENDING_SQL = """
SELECT DISTINCT ON (t.endpoint_id) t.endpoint_id, e.slug, t.id
FROM queues_todo t JOIN queues_endpoint e ON e.id = t.endpoint_id
WHERE t.queue = %s AND t.state = 'pending' AND e.state = 'active'
ORDER BY t.endpoint_id, t.created_at, t.id
"""


# The live board's fingerprint: live todos per identity and state, with the latest change.
LIVE_TODOS_SQL = """
SELECT endpoint_id::text, queue, state, count(*), max(updated_at)
FROM queues_todo
WHERE state IN ('pending', 'claimed') OR (state = 'failed' AND next_retry_at IS NOT NULL)
GROUP BY 1, 2, 3
"""


# The named limits as the live board's snapshot sees them: each declaration's last change and how
# many claims hold it now. A card a pool holds is freed by a claim ending on another queue (one
# the board may not show), and only this moves the board's fingerprint for it.
LIVE_LIMITS_SQL = """
SELECT 'pool', p.name, p.updated_at,
       (SELECT count(*) FROM queues_todo t WHERE t.state = 'claimed' AND t.pool = p.name)
FROM limits_pool p
UNION ALL
SELECT 'tag', g.tag, g.updated_at,
       (SELECT count(*) FROM queues_todo t
        WHERE t.state = 'claimed' AND t.tags <> '{}' AND t.tags @> ARRAY[g.tag]::varchar[])
FROM limits_taglimit g
UNION ALL
SELECT 'rate', r.name, r.updated_at, NULL FROM limits_ratelimit r
ORDER BY 1, 2
"""


# Counts by state (and dead letters) per queue identity of the given endpoints (the board).
IDENTITY_COUNTS_SQL = """
SELECT endpoint_id, queue, state, count(*),
       count(*) FILTER (WHERE state = 'failed' AND next_retry_at IS NULL)
FROM queues_todo WHERE endpoint_id = ANY(%s)
GROUP BY endpoint_id, queue, state
"""


def queue_counts_sql(*, narrowed: bool) -> str:
    """Counts by state per queue name (the queue list), narrowed to some endpoints or not."""
    where = "WHERE endpoint_id = ANY(%s)" if narrowed else ""
    return f"""
SELECT queue, state, count(*),
       count(*) FILTER (WHERE state = 'failed' AND next_retry_at IS NULL),
       min(created_at) FILTER (WHERE state = 'pending')
FROM queues_todo {where}
GROUP BY queue, state
"""


# Why a transition matched nothing: the todo's state, its current attempt, whether the lease is
# live, and that attempt's fence, if in scope.
# Why a holder's verb matched nothing (queues.services.todos._raise_unmatched); the last column:
# whether the token presented was an earlier attempt's of this todo (superseded, not wrong).
UNMATCHED_SQL = """
SELECT t.state, t.attempt, t.lease_expires_at > clock_timestamp(), t.lease_token_hash,
       t.owner,
       EXISTS (SELECT 1 FROM queues_attempt a WHERE a.todo_id = t.id AND a.lease_token_hash = %s),
       -- Not claimed: the limit whose quarantine expired the claim that ended last, if one did
       -- ("kind:name", from the error its expiry wrote: queues.sql.gated).
       CASE WHEN t.state <> 'claimed' THEN
           (SELECT (a.error ->> 'kind') || ':' || (a.error ->> 'name') FROM queues_attempt a
            WHERE a.todo_id = t.id AND a.number = t.attempt AND a.outcome = 'expired'
              AND a.error ->> 'error' = 'quarantined'
            ORDER BY a.ended_at DESC LIMIT 1)
       END
FROM queues_todo t
WHERE t.id = %s AND t.endpoint_id = ANY(%s)
"""


# Occupancy history (issue 13): per pool and per tag, per minute since %(since)s, the most claims
# naming it held at once in that minute. Each claim that overlaps the window is a +1 at its start
# (or the window's) and a -1 at its end; their running sum in time order (an end before a start at
# the same instant: a slot freed and taken again) is the level held. Per minute with events: the
# highest level reached in it and the level it ends at (``activity.occupancy_history`` carries that
# into the minutes after, which have no events). attempt_claimed_brin finds recent attempts.
OCCUPANCY_HISTORY_SQL = """
WITH held AS (
    SELECT a.todo_id, a.claimed_at, a.ended_at FROM queues_attempt a
    WHERE a.claimed_at <= %(now)s AND a.ended_at >= %(since)s
    UNION ALL
    -- The claims in progress (their Attempt rows are written when they end).
    SELECT t.id, t.claimed_at, NULL FROM queues_todo t
    WHERE t.state = 'claimed' AND t.claimed_at <= %(now)s
),
spans AS (
    SELECT t.pool, t.tags, GREATEST(a.claimed_at, %(since)s) AS s,
           CASE WHEN a.ended_at < %(now)s THEN a.ended_at END AS e
    FROM held a JOIN queues_todo t ON t.id = a.todo_id
    WHERE (t.pool IS NOT NULL OR t.tags <> '{}')
),
named AS (
    SELECT 'pool' AS kind, s.pool AS name, s.s, s.e FROM spans s WHERE s.pool IS NOT NULL
    UNION ALL
    SELECT 'tag', g.tag, s.s, s.e FROM spans s CROSS JOIN LATERAL unnest(s.tags) AS g(tag)
),
events AS (
    SELECT kind, name, s AS at, 1 AS d FROM named
    UNION ALL
    SELECT kind, name, e, -1 FROM named WHERE e IS NOT NULL
),
levels AS (
    SELECT kind, name, at,
           sum(d) OVER w AS level,
           row_number() OVER w AS n
    FROM events
    WINDOW w AS (PARTITION BY kind, name ORDER BY at, d ROWS UNBOUNDED PRECEDING)
)
SELECT kind, name, date_trunc('minute', at) AS minute, max(level),
       (array_agg(level ORDER BY n DESC))[1]
FROM levels
GROUP BY 1, 2, 3
"""
