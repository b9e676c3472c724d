"""The ledger's tables: the hash-chained rows and the signed head of each chain."""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from switchboard.constraints import CheckSQL, one_of

# The grant chains (1..GRANT_CHAINS) beside chain 0; the migration that made them
# (0009_grant_chains) fixes the number: changing it takes a new migration (the SQL function,
# the heads and the check constraints name it).
GRANT_CHAINS = 8


class LedgerKind(models.TextChoices):
    POLICY_CREATE = "policy.create"
    POLICY_UPDATE = "policy.update"
    POLICY_DELETE = "policy.delete"
    QUEUE_PAUSE = "queue.pause"
    QUEUE_RESUME = "queue.resume"
    ADMISSION_WAIVER = "admission.waiver"
    LIMITS_WAIVER = "limits.waiver"
    LIMITS_SET = "limits.set"
    LIMITS_DELETE = "limits.delete"
    LIMITS_QUARANTINE = "limits.quarantine"
    LIMITS_QUEUE = "limits.queue"
    # A claim admitted through a named limit (pool, tag, rate limit) and the end of that claim.
    LIMITS_GRANT = "limits.grant"
    LIMITS_END = "limits.end"
    ENDPOINT_VEND = "endpoint.vend"
    ENDPOINT_UPDATE = "endpoint.update"
    ENDPOINT_REVOKE = "endpoint.revoke"
    ENDPOINT_HOOK_SECRET_ROTATE = "endpoint.hook_secret_rotate"
    TOKEN_CREATE = "token.create"
    TOKEN_REVOKE = "token.revoke"
    # A human's claim (the console's "Claim as operator"): it takes work an agent would have.
    TODO_CLAIM = "todo.claim"
    TODO_RETRY = "todo.retry"
    TODO_DISCARD = "todo.discard"
    # A human's ending of a claim (services.todos._human_end); an agent's own is not a decision.
    TODO_COMPLETE = "todo.complete"
    TODO_FAIL = "todo.fail"
    TODO_RELEASE = "todo.release"


class LedgerEntry(models.Model):
    """One append-only, hash-chained row. The app never updates or deletes these.

    Actors are plain columns, not foreign keys, so the hashed history never changes when a user
    or an endpoint is deleted.
    """

    # The table's one order across chains (drawn from the sequence ``ledger_seq`` under the
    # chain's lock: it rises along each chain; rows of other chains fill the gaps between).
    seq = models.BigIntegerField(primary_key=True)
    # Chain 0: every declaration and decision; 1..GRANT_CHAINS: grant and end rows (chain.py).
    chain = models.PositiveSmallIntegerField(default=0)
    # The row's place in its chain: 1, 2, 3... with no gaps.
    chain_pos = models.BigIntegerField(default=0)
    prev_hash = models.CharField(max_length=64)
    kind = models.CharField(max_length=32, choices=LedgerKind.choices)
    actor_human_id = models.BigIntegerField(null=True, blank=True)
    actor_human_name = models.CharField(max_length=150, blank=True, default="")
    actor_endpoint_id = models.UUIDField(null=True, blank=True)
    actor_endpoint_slug = models.CharField(max_length=63, blank=True, default="")
    scope = models.CharField(max_length=100, blank=True, default="")
    queue = models.CharField(max_length=64, blank=True, default="")
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)
    at = models.DateTimeField()
    # Unique (a grant is named by its row's hash); no pattern-ops twin index: nothing searches
    # it by prefix (0009 drops the one Django makes for a unique CharField).
    entry_hash = models.CharField(max_length=64, unique=True)

    class Meta:
        # The table keeps the name it had when the ledger lived in the admission app.
        db_table = "admission_ledgerentry"
        ordering = ["seq"]
        verbose_name_plural = "ledger entries"
        indexes = [
            # The audit tail of one policy (GET /api/v1/admission/{scope}/{queue}) and the filters.
            models.Index(fields=["scope", "queue", "-seq"], name="ledger_scope_queue_idx"),
            models.Index(fields=["kind", "-seq"], name="ledger_kind_idx"),
            models.Index(fields=["at"], name="ledger_at_idx"),
        ]
        constraints = [
            models.CheckConstraint(name="ledger_seq_positive", condition=Q(seq__gte=1)),
            # One array constant (switchboard.constraints): every grant and end row a named claim
            # cycle appends is checked against it.
            models.CheckConstraint(name="ledger_kind_valid", condition=one_of("kind", LedgerKind)),
            models.UniqueConstraint(fields=["chain", "chain_pos"], name="ledger_chain_pos_unique"),
            # A grant chain holds grant and end rows only; chain 0 may hold them too (rows from
            # before the grant chains, and a transaction that held chain 0 already).
            models.CheckConstraint(
                name="ledger_chain_valid",
                condition=CheckSQL(
                    f"{{0}} = 0 OR ({{0}} <= {GRANT_CHAINS} AND {{1}}::text = ANY "
                    f"('{{{{{LedgerKind.LIMITS_GRANT},{LedgerKind.LIMITS_END}}}}}'::text[]))",
                    "chain",
                    "kind",
                ),
            ),
        ]

    def __str__(self) -> str:
        return f"#{self.seq} {self.kind}"


class LedgerHead(models.Model):
    """A chain's last row, signed with the ledger key: one row per chain (``id`` is the chain),
    rewritten by every append to it; every chain's head exists from the start (a head at
    ``chain_pos`` 0 is a chain with no rows yet).

    A chain whose last rows were deleted still verifies on its own; comparing it with the signed
    head catches that, and a missing head is a deleted chain (``chain.verify``).
    """

    id = models.PositiveSmallIntegerField(primary_key=True, default=0)
    seq = models.BigIntegerField()
    chain_pos = models.BigIntegerField(default=0)
    entry_hash = models.CharField(max_length=64)
    mac = models.CharField(max_length=64)

    class Meta:
        db_table = "admission_ledgerhead"
        constraints = [
            models.CheckConstraint(
                name="ledger_head_one_per_chain", condition=Q(id__lte=GRANT_CHAINS)
            )
        ]

    def __str__(self) -> str:
        return f"ledger chain {self.id} head #{self.seq}"


class LedgerCheck(models.Model):
    """The last full verification of the chain: one row, rewritten by every check.

    Verifying reads the whole chain, so pages show this stored result instead of verifying on
    every view; a beat task checks periodically and anyone who reads the ledger may ask for a
    check now. It is a cache: deleting it only means the next page view checks once.
    """

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    checked_at = models.DateTimeField()
    ok = models.BooleanField()
    report = models.JSONField()

    class Meta:
        constraints = [models.CheckConstraint(name="ledger_check_single_row", condition=Q(id=1))]

    def __str__(self) -> str:
        return f"ledger check at {self.checked_at:%Y-%m-%d %H:%M:%S}"
