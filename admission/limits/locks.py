"""The pools' and tags' locks: one transaction-scoped advisory lock per limit, keyed
(class, ``hashtext(name)``), taken through ``limits_lock`` (limits migration 0005) so every caller
takes a set of them each key once, in key order.

Keyed by name, not by row id: the lock is taken before anything is read (the todo names its
limits by name), and a limit deleted and declared again is the same lock. Two names whose hashes
collide share a lock: more waiting, never less exclusion. The two-integer keys live apart from
the ledger's one-bigint lock key in PostgreSQL's lock table.

Who takes them (the argument is in ``admission.limits.gates``): a claim far from the cap takes
its limit's lock shared, near it exclusive; an ending claim takes it shared (its reopen ring);
every change of a declaration takes it exclusive (the services first, and a trigger on the
tables for any other writer).
"""

from __future__ import annotations

from typing import Any

# The classes (first key). Also literals in limits migration 0005's SQL.
POOL_LOCK_CLASS = 19536  # "LP"
TAG_LOCK_CLASS = 19540  # "LT"

CLASSES = {"pool": POOL_LOCK_CLASS, "tag": TAG_LOCK_CLASS}


def lock(cursor: Any, kind: str, names: list[str], *, shared: bool = False) -> None:
    """Take the locks of the ``kind`` ("pool" or "tag") limits ``names`` in this transaction,
    exclusive unless ``shared``."""
    cursor.execute(
        "SELECT limits_lock(%s, %s::varchar[], %s::varchar[])",
        [CLASSES[kind], names, names if shared else []],
    )
