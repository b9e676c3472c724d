"""Endpoints, todos, attempts, queue pauses and personal access tokens.

The claim statements in ``queues/sql.py`` are raw SQL over these tables; the partial indexes
below name the statement or sweep that uses each one.
"""

from __future__ import annotations

import uuid
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.contrib.postgres.indexes import BrinIndex, GinIndex
from django.db import models
from django.db.models import Q, Value
from django.utils import timezone

from switchboard.constraints import CheckSQL, one_of
from switchboard.core.errors import InvalidArgument
from switchboard.core.validation import SafeJSONDecoder, fullmatch, validate_stored_json

QUARANTINE_QUEUE = "quarantine"
QUEUE_NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$"


# Pools, tag limits and rate limits: canonical names (lower case), matched in full (``$`` would
# let a trailing newline through) and by the database's CHECKs.
LIMIT_NAME_RE = r"^[a-z0-9][a-z0-9_.-]{0,63}$"
MAX_TODO_TAGS = 8


def check_limit_name(value: Any, *, field_name: str) -> str:
    """A canonical limit name, or ``invalid_argument`` naming the field."""
    if not fullmatch(LIMIT_NAME_RE, value):
        raise InvalidArgument(
            f"{field_name} must be 1-64 lower-case letters, digits, '.', '_' or '-', "
            "starting with a letter or digit",
            field=field_name,
        )
    return value


def check_queue_name(queue: str, *, field_name: str = "queue") -> str:
    """The queue name, or ``invalid_argument`` naming the field (the database checks it too)."""
    if not fullmatch(QUEUE_NAME_RE, queue):
        raise InvalidArgument(
            f"{field_name} must be 1-64 letters, digits, '.', '_', ':' or '-', "
            "starting with a letter or digit",
            field=field_name,
        )
    return queue


SLUG_RE = r"^[a-z0-9][a-z0-9-]{0,62}$"


def check_slug(slug: str) -> str:
    """An endpoint slug: lowercase letters, digits and '-', and never shaped like a UUID (so
    ``endpoint:<id>`` can never name two endpoints)."""
    if not fullmatch(SLUG_RE, slug):
        raise InvalidArgument(
            "slug must be 1-63 lowercase letters, digits and '-', starting with a letter or digit",
            field="slug",
        )
    if looks_like_uuid(slug):
        raise InvalidArgument("slug must not have the shape of an id (a UUID)", field="slug")
    return slug


def looks_like_uuid(value: str) -> bool:
    try:
        uuid.UUID(value)
    except (ValueError, TypeError, AttributeError):
        return False
    return True


class Verb(models.TextChoices):
    LIST_TODOS = "list_todos"
    GET_TODO = "get_todo"
    CLAIM = "claim"
    CLAIM_NEXT = "claim_next"
    HEARTBEAT = "heartbeat"
    COMPLETE = "complete"
    FAIL = "fail"
    RELEASE = "release"
    CREATE_TODO = "create_todo"
    ADMISSION_STATUS = "admission_status"
    SET_ADMISSION_POLICY = "set_admission_policy"
    CLEAR_ADMISSION_POLICY = "clear_admission_policy"
    REPORT_RATE_LIMITED = "report_rate_limited"
    LIMITS_STATUS = "limits_status"


# What a vend grants unless told otherwise: exactly the todo verbs.
BASIC_VERBS: tuple[str, ...] = (
    Verb.LIST_TODOS,
    Verb.GET_TODO,
    Verb.CLAIM,
    Verb.CLAIM_NEXT,
    Verb.HEARTBEAT,
    Verb.COMPLETE,
    Verb.FAIL,
    Verb.RELEASE,
    Verb.CREATE_TODO,
)
# Their own family: never in the basic grant; "lets the agent change its own budget".
POLICY_VERBS: tuple[str, ...] = (Verb.SET_ADMISSION_POLICY, Verb.CLEAR_ADMISSION_POLICY)
# Granted by implication to an endpoint that holds claim or claim_next.
DRAIN_VERBS: tuple[str, ...] = (Verb.CLAIM, Verb.CLAIM_NEXT)
# Their own family: reporting a 429 halves a shared rate limit for every agent naming it.
RATE_VERBS: tuple[str, ...] = (Verb.REPORT_RATE_LIMITED,)
GRANTABLE_VERBS: tuple[str, ...] = (
    *BASIC_VERBS,
    Verb.ADMISSION_STATUS,
    Verb.LIMITS_STATUS,
    *POLICY_VERBS,
    *RATE_VERBS,
)


def hook_origin(url: str) -> str:
    """A hook URL's scheme, host and port, the rest shown as ``/…``: a receiver's secret may sit
    in the path or the query, so pages, answers and the ledger show only where hooks go (""
    for none)."""
    if not url:
        return ""
    parts = urlsplit(url)
    origin = f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"
    return origin + ("/" if url[len(origin) :] in ("", "/") else "/…")


class EndpointState(models.TextChoices):
    ACTIVE = "active"
    REVOKED = "revoked"


# The largest request burst an endpoint may have (queues.services.endpoints checks it, naming
# the field; the API's schema and the admin's input state it).
MAX_BURST = 1_000_000
# The most queues an endpoint's scope names, and the longest personal token name (the service
# checks both, naming the field; the API's schema states the first).
MAX_SCOPE_QUEUES = 100
MAX_TOKEN_NAME = 100


class Endpoint(models.Model):
    """An agent's credential and scope. Scope never widens after vend: revoke and vend again."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    slug = models.CharField(max_length=63, unique=True)
    name = models.CharField(max_length=200)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="endpoints"
    )
    token_hash = models.CharField(max_length=64, unique=True, editable=False)
    token_prefix = models.CharField(max_length=16, editable=False)
    scope_queues = ArrayField(models.CharField(max_length=64))
    scope_verbs = ArrayField(models.CharField(max_length=40))
    state = models.CharField(
        max_length=10, choices=EndpointState.choices, default=EndpointState.ACTIVE
    )
    default_lease_ttl_seconds = models.PositiveIntegerField(null=True, blank=True)
    # Request rate limit; null means the server default (ENDPOINT_RATE_LIMIT), 0 means unlimited.
    rate_limit_rps = models.FloatField(null=True, blank=True)
    rate_limit_burst = models.PositiveIntegerField(null=True, blank=True)
    notify_url = models.URLField(max_length=500, blank=True, default="")
    notify_secret = models.CharField(max_length=200, blank=True, default="", editable=False)
    # After a rotation the old secret still signs until ``..._until`` (endpoint_rotate_hook_secret),
    # so a receiver can switch to the new one without dropping a hook.
    notify_secret_previous = models.CharField(
        max_length=200, blank=True, default="", editable=False
    )
    notify_secret_previous_until = models.DateTimeField(null=True, blank=True, editable=False)
    # The last ready hook that gave up after every attempt (cleared by the next delivery).
    hook_failed_at = models.DateTimeField(null=True, blank=True, editable=False)
    hook_error = models.CharField(max_length=500, blank=True, default="", editable=False)
    last_seen_at = models.DateTimeField(null=True, blank=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        ordering = ["slug"]
        constraints = [
            models.CheckConstraint(
                name="endpoint_state_valid", condition=Q(state__in=EndpointState.values)
            ),
            models.CheckConstraint(name="endpoint_slug_format", condition=Q(slug__regex=SLUG_RE)),
            models.CheckConstraint(
                name="endpoint_lease_ttl_range",
                condition=Q(default_lease_ttl_seconds__isnull=True)
                | Q(default_lease_ttl_seconds__gte=1, default_lease_ttl_seconds__lte=86400),
            ),
            models.CheckConstraint(
                name="endpoint_rate_limit_range",
                condition=Q(rate_limit_rps__isnull=True)
                | Q(rate_limit_rps__gte=0, rate_limit_rps__lte=100000),
            ),
            models.CheckConstraint(
                name="endpoint_scope_queues_nonempty", condition=Q(scope_queues__len__gte=1)
            ),
            models.CheckConstraint(
                name="endpoint_scope_verbs_known",
                condition=Q(scope_verbs__contained_by=list(GRANTABLE_VERBS)),
            ),
            models.CheckConstraint(
                name="endpoint_revoked_has_time",
                condition=Q(state=EndpointState.ACTIVE) | Q(revoked_at__isnull=False),
            ),
        ]

    def __str__(self) -> str:
        return self.slug

    @property
    def is_active(self) -> bool:
        return self.state == EndpointState.ACTIVE

    @property
    def hook_origin(self) -> str:
        """Where ready hooks go, as anyone who reads the endpoint may see it (``hook_origin``)."""
        return hook_origin(self.notify_url)

    def holds(self, verb: str) -> bool:
        """Whether the grant covers a verb; the status reads ride on the drain grant."""
        if verb in (Verb.ADMISSION_STATUS, Verb.LIMITS_STATUS):
            return any(v in self.scope_verbs for v in DRAIN_VERBS) or verb in self.scope_verbs
        return verb in self.scope_verbs


class TodoState(models.TextChoices):
    PENDING = "pending"
    CLAIMED = "claimed"
    DONE = "done"
    FAILED = "failed"
    # Terminal: an operator gave up on it (``todo_discard``, audited in the ledger).
    DISCARDED = "discarded"


class TodoSource(models.TextChoices):
    API = "api"
    MCP = "mcp"
    CLI = "cli"
    ADMIN = "admin"
    BOARD = "board"
    DEMO = "demo"


# A live todo holds its idempotency slot: not done and not dead-lettered.
LIVE_TODO = Q(state__in=[TodoState.PENDING, TodoState.CLAIMED]) | Q(
    state=TodoState.FAILED, next_retry_at__isnull=False
)


class Todo(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # Indexed through todo_endpoint_recent_idx and the partial indexes, not an index of its own.
    endpoint = models.ForeignKey(
        Endpoint, on_delete=models.CASCADE, related_name="todos", db_index=False
    )
    queue = models.CharField(max_length=64)
    title = models.CharField(max_length=500)
    kind = models.CharField(max_length=100, blank=True, default="")
    # Read with a decoder that never raises and written through the edge bounds, so a row stored
    # behind the services' back can still be listed and claimed (switchboard/validation.py).
    payload = models.JSONField(
        default=dict, blank=True, decoder=SafeJSONDecoder, validators=[validate_stored_json]
    )
    idempotency_key = models.CharField(max_length=200, null=True, blank=True)
    state = models.CharField(max_length=10, choices=TodoState.choices, default=TodoState.PENDING)
    # Who holds the claim: the claimant the agent named, or the endpoint slug / operator.
    owner = models.CharField(max_length=200, blank=True, default="")
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    # The claim's number: it never goes back, an operator's retry included, so an agent's
    # ``attempt`` names one claim only (HOLDS_CLAIM: a claim ended before a retry cannot end
    # the claim made after it).
    attempt = models.PositiveIntegerField(default=0)
    # The attempt number at which a failure is final. An operator's retry gives the todo a
    # fresh round of the attempts it was pushed with: ``retried_after`` becomes the attempt it
    # stopped at and ``max_attempts`` that plus the round (todo_max_attempts_range: the round is
    # 1..100). IntegerFields: their rules are the triggers', and a PositiveIntegerField's own
    # CHECK (>= 0) would be one more parsed and planned in every write of the row (issue 12).
    max_attempts = models.IntegerField(default=5)
    retried_after = models.IntegerField(default=0, db_default=0, editable=False)
    next_retry_at = models.DateTimeField(null=True, blank=True)
    result = models.JSONField(
        null=True, blank=True, decoder=SafeJSONDecoder, validators=[validate_stored_json]
    )
    source = models.CharField(max_length=10, choices=TodoSource.choices, default=TodoSource.API)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    claimed_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # The doorbell's sweeps (queues/services/doorbell_sweeps.py): how many reminders rang for the
    # todo since it last changed (``rung_since`` is the ``updated_at`` they count from), and when
    # its holder was last told it stalled.
    rings = models.PositiveSmallIntegerField(default=0, db_default=0, editable=False)
    rung_since = models.DateTimeField(null=True, blank=True, editable=False)
    stall_rung_at = models.DateTimeField(null=True, blank=True, editable=False)
    # Named limits the claim enforces (admission.limits declares them; intake refuses undeclared
    # names through queues.declared).
    pool = models.CharField(max_length=64, null=True, blank=True)
    # The database default serves raw inserts (the benches' bulk seeding) as the ORM's does.
    tags = ArrayField(
        models.CharField(max_length=64), default=list, db_default=Value([]), blank=True
    )
    rate_limit = models.CharField(max_length=64, null=True, blank=True)
    # The claim's grant: the entry_hash of the ``limits.grant`` ledger row written when a claim
    # passed a named limit (pool, tag, rate limit; not ``off``). Cleared when the claim ends.
    grant_hash = models.CharField(max_length=64, null=True, blank=True, editable=False)
    # The claim in progress, besides ``owner``, ``claimed_at`` and ``lease_expires_at``: the hash
    # of its lease token (a fenced claim's; NULL when unfenced) and how it was claimed (api, mcp,
    # console, …). Its Attempt row is written when it ends, from these columns (``Attempt``).
    lease_token_hash = models.CharField(max_length=64, null=True, blank=True, editable=False)
    claim_via = models.CharField(
        max_length=10, blank=True, default="", db_default="", editable=False
    )

    class Meta:
        ordering = ["created_at", "id"]
        # In the database none of these CHECKs is a CHECK: each is a trigger's rule with the
        # same name, rule and error. PostgreSQL parses and plans every CHECK of a table again in
        # each statement that writes a row, and the claim and its ending update it twice per
        # cycle (issue 12); a PL/pgSQL function keeps its plans. The seven on fields no
        # claim changes (pool, rate_limit, tags, queue, title, max_attempts with retried_after,
        # which only a retry sets; queues migrations 0013, 0024) run when a write sets those
        # fields (todo_fields_check); the others, and
        # the >= 0 rules of ``attempt`` and ``rings`` (queues_todo_attempt_check,
        # queues_todo_rings_check), on every insert and every update that sets a column they
        # read (todo_state_check, queues migration 0016). Django's state keeps all of them here,
        # so model validation runs them; a change to one is a change to those functions too.
        constraints = [
            models.CheckConstraint(name="todo_pool_format", condition=Q(pool__regex=LIMIT_NAME_RE)),
            models.CheckConstraint(
                name="todo_rate_limit_format", condition=Q(rate_limit__regex=LIMIT_NAME_RE)
            ),
            # The CHECKs below that are raw SQL say what Django's lookups would say in fewer
            # expression nodes: PostgreSQL parses every CHECK of a table from its stored text
            # and plans it again in every statement that writes a row (ExecConstraints), twice
            # per claim cycle for this table, and that was a sixth of the database's CPU per
            # cycle (issue 12). ``state IN (...)`` is stored as an array of five casts; one
            # array constant is half the size. Same rules, same names (queues migration 0012).
            # array_length is NULL for an empty array, which a CHECK lets through.
            models.CheckConstraint(
                name="todo_tags_at_most_8",
                condition=CheckSQL(f"array_length({{0}}, 1) <= {MAX_TODO_TAGS}", "tags"),
            ),
            # array_position: NULL when no tag is '' (an empty tag), as NOT '' = ANY(tags).
            models.CheckConstraint(
                name="todo_tags_format",
                condition=CheckSQL(
                    "array_to_string({0}, ',') ~ '^([a-z0-9][a-z0-9_.-]{{0,63}}(,|$))*$' "
                    "AND array_position({0}, '') IS NULL",
                    "tags",
                ),
            ),
            models.CheckConstraint(name="todo_state_valid", condition=one_of("state", TodoState)),
            models.CheckConstraint(
                name="todo_queue_format", condition=Q(queue__regex=QUEUE_NAME_RE)
            ),
            models.CheckConstraint(name="todo_title_nonempty", condition=~Q(title="")),
            models.CheckConstraint(
                name="todo_max_attempts_range",
                condition=Q(
                    max_attempts__gte=models.F("retried_after") + 1,
                    max_attempts__lte=models.F("retried_after") + 100,
                ),
            ),
            models.CheckConstraint(
                name="todo_retried_after_an_attempt",
                condition=Q(retried_after__gte=0, retried_after__lte=models.F("attempt")),
            ),
            models.CheckConstraint(
                name="todo_attempt_within_max", condition=Q(attempt__lte=models.F("max_attempts"))
            ),
            models.CheckConstraint(
                name="todo_claimed_has_lease",
                condition=~Q(state=TodoState.CLAIMED)
                | Q(lease_expires_at__isnull=False, attempt__gte=1),
            ),
            models.CheckConstraint(
                name="todo_retry_only_when_failed",
                condition=Q(next_retry_at__isnull=True) | Q(state=TodoState.FAILED),
            ),
            # Idempotency: one live todo per endpoint and key.
            models.UniqueConstraint(
                fields=["endpoint", "idempotency_key"],
                condition=Q(idempotency_key__isnull=False) & LIVE_TODO,
                name="todo_live_idempotency_key",
            ),
        ]
        indexes = [
            # The live todos naming a pool, and those naming tags (btree_gin gives the GIN index
            # its ``state`` column): a pool's and a tag's occupancy (claimed), counted under the
            # limit's lock in every claim that names one (admission.limits.gates), and the work
            # waiting on them (pending), who an ending claim that frees a unit wakes
            # (gates.reopens: one ring per queue identity) and who a raised limit wakes. One
            # index each, not one per state: every update of a todo opens each index of the
            # table and plans its predicate, whether the row enters it or not, and the claim
            # cycle updates a todo twice (issue 12; queues migration 0020). A read states the
            # predicate through ``state = 'claimed'`` / ``'pending'`` and ``pool = ...`` (not
            # NULL) or ``tags <> '{}'``. The GIN index has no pending list (fastupdate off): a
            # tag's occupancy would read all of it, the backlog's new todos included.
            models.Index(
                fields=["pool", "state"],
                condition=Q(pool__isnull=False, state__in=[TodoState.PENDING, TodoState.CLAIMED]),
                name="todo_live_pool_idx",
            ),
            GinIndex(
                fields=["state", "tags"],
                condition=~Q(tags=[]) & Q(state__in=[TodoState.PENDING, TodoState.CLAIMED]),
                name="todo_live_tags_idx",
                fastupdate=False,
            ),
            # claim_next's candidate scan (queues/sql.py claim_next_sql, FOR UPDATE SKIP
            # LOCKED): the endpoint's live rows in created_at order, so the oldest claimable row
            # of any granted queue is found without sorting the backlog.
            models.Index(
                fields=["endpoint", "created_at", "id"],
                condition=LIVE_TODO,
                name="todo_claimable_idx",
            ),
            # Pending counts and the oldest pending todo per queue identity (queue_stats, the
            # admission deferred counts, the ready hook's "oldest pending todo").
            models.Index(
                fields=["endpoint", "queue", "created_at"],
                condition=Q(state=TodoState.PENDING),
                name="todo_pending_idx",
            ),
            # In-flight count under the policy lock (admission), the claimed gauges, and
            # reap_expired (which reads every claimed row: in flight is bounded by the workers,
            # so a lease-expiry index would cost every claim more than it saves the sweep).
            models.Index(
                fields=["endpoint", "queue"],
                condition=Q(state=TodoState.CLAIMED),
                name="todo_claimed_idx",
            ),
            # requeue_due_retries and the claim predicate's due-retry arm.
            models.Index(
                fields=["next_retry_at"],
                condition=Q(state=TodoState.FAILED, next_retry_at__isnull=False),
                name="todo_due_retry_idx",
            ),
            # Lists and the board: newest first per endpoint.
            models.Index(fields=["endpoint", "-created_at"], name="todo_endpoint_recent_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.queue}: {self.title}"

    @property
    def dead_letter(self) -> bool:
        return self.state == TodoState.FAILED and self.next_retry_at is None

    @property
    def lease_lapsed(self) -> bool:
        """A claim whose lease has run out: its holder went quiet; the next claim takes it over
        (attempts left) or the reaper moves it on. Every page and refusal says so alike."""
        return (
            self.state == TodoState.CLAIMED
            and self.lease_expires_at is not None
            and self.lease_expires_at <= timezone.now()
        )


class AttemptOutcome(models.TextChoices):
    COMPLETED = "completed"
    FAILED = "failed"
    RELEASED = "released"
    EXPIRED = "expired"  # the reaper took the lapsed lease back
    SUPERSEDED = "superseded"  # another claim took the lapsed lease over
    REVOKED = "revoked"  # the endpoint was revoked while the claim was live


class AttemptDisposition(models.TextChoices):
    DONE = "done"
    RETRY_SCHEDULED = "retry_scheduled"
    DEAD_LETTERED = "dead_lettered"
    REQUEUED = "requeued"


# The longest summary an ending (complete, fail) keeps, in characters (queues.services.todos
# checks it first, naming the field; the attempt's rules trigger again, queues migration 0023).
MAX_ATTEMPT_SUMMARY = 10000


class Attempt(models.Model):
    """One row per claim that ended (completed, failed, released, lapsed, taken over, revoked),
    written by the statement that ends it and never changed after. The claim in progress is
    the todo's own columns (``owner``, ``claimed_at``, ``lease_expires_at``, ``lease_token_hash``,
    ``claim_via``, ``attempt``): a todo holds at most one claim, so at most one attempt is open,
    by construction (``queues.selectors.todo_attempts`` lists both). Writing the row once, at
    the end, costs a claim cycle one insert where an open row cost an insert, an update and the
    one-open check (issue 12: about an eighth of the database's instructions per cycle)."""

    # Indexed through attempt_todo_number_idx; attempts are not looked up by endpoint on any
    # hot path, so neither foreign key carries an index of its own (each costs every claim).
    todo = models.ForeignKey(
        Todo, on_delete=models.CASCADE, related_name="attempts", db_index=False
    )
    # An IntegerField: attempt_number_positive (>= 1) is its rule, and a PositiveIntegerField's
    # own CHECK (>= 0) would be one more parsed and planned in every write of the row (issue 12).
    number = models.IntegerField()
    # No constraint in the database: the claim statement copies it from the attempt's todo,
    # whose own foreign key holds the endpoint (and the todo's, this attempt's). Checking it
    # again took a KEY SHARE lock on the endpoint's row in every claim, which concurrent claimers
    # of one endpoint share through a multixact (issue 12). Deletes still cascade (Django's).
    endpoint = models.ForeignKey(
        Endpoint,
        on_delete=models.CASCADE,
        related_name="attempts",
        db_index=False,
        db_constraint=False,
    )
    claimant = models.CharField(max_length=200, blank=True, default="")
    via = models.CharField(max_length=10, blank=True, default="")
    claimed_at = models.DateTimeField()
    lease_expires_at = models.DateTimeField()
    lease_token_hash = models.CharField(max_length=64, null=True, blank=True)
    ended_at = models.DateTimeField()
    outcome = models.CharField(max_length=12, choices=AttemptOutcome.choices)
    disposition = models.CharField(
        max_length=16, choices=AttemptDisposition.choices, null=True, blank=True
    )
    summary = models.TextField(blank=True, default="")
    # What the agent said went wrong on this attempt (``fail``'s error), kept per attempt so an
    # operator sees every failure, not only the last one the todo's result holds.
    error = models.JSONField(
        null=True, blank=True, decoder=SafeJSONDecoder, validators=[validate_stored_json]
    )

    class Meta:
        ordering = ["todo", "claimed_at", "id"]
        indexes = [
            # A todo's attempts, in order (the console's todo page, the admin).
            models.Index(fields=["todo", "number"], name="attempt_todo_number_idx"),
            # The throughput chart's last hour (queues/activity.py THROUGHPUT_SQL): block-range
            # indexes, which cost a claim next to nothing, since attempts arrive in time order.
            BrinIndex(fields=["claimed_at"], name="attempt_claimed_brin"),
            BrinIndex(fields=["ended_at"], name="attempt_ended_brin"),
        ]
        constraints = [
            # In the database these are the rules of a trigger of the same names (queues
            # migrations 0016, 0021 and 0023), as the todo's. Every attempt is an ended one: ended_at
            # and outcome are NOT NULL columns.
            models.CheckConstraint(name="attempt_number_positive", condition=Q(number__gte=1)),
            # The compact form, as the todo's (see Todo.Meta).
            models.CheckConstraint(
                name="attempt_outcome_valid", condition=one_of("outcome", AttemptOutcome)
            ),
            models.CheckConstraint(
                name="attempt_summary_length",
                condition=CheckSQL(f"char_length({{0}}) <= {MAX_ATTEMPT_SUMMARY}", "summary"),
            ),
        ]

    def __str__(self) -> str:
        return f"attempt {self.number} of {self.todo_id}"


# The longest pause reason, in characters (queues.pauses checks it first, naming the field).
MAX_PAUSE_REASON = 500


class QueuePause(models.Model):
    """One row per paused queue name, fleet-wide. Resume deletes it."""

    queue = models.CharField(max_length=64, primary_key=True)
    reason = models.TextField()
    paused_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="queue_pauses"
    )
    paused_at = models.DateTimeField()

    class Meta:
        ordering = ["queue"]
        permissions = [("pause_queue", "Can pause and resume any queue")]
        constraints = [
            models.CheckConstraint(name="pause_reason_nonempty", condition=~Q(reason="")),
            models.CheckConstraint(
                name="pause_reason_length",
                condition=CheckSQL(f"char_length({{0}}) <= {MAX_PAUSE_REASON}", "reason"),
            ),
            models.CheckConstraint(
                name="pause_not_quarantine", condition=~Q(queue=QUARANTINE_QUEUE)
            ),
            models.CheckConstraint(
                name="pause_queue_format", condition=Q(queue__regex=QUEUE_NAME_RE)
            ),
        ]

    def __str__(self) -> str:
        return f"{self.queue} (paused)"


# The beat's sweeps of todos (queues.tasks), each every SWEEP_INTERVAL_SECONDS.
SWEEPS = ["reap_expired", "requeue_due_retries", "remind_waiting", "ring_stalled"]


class SweepRun(models.Model):
    """When each beat sweep last finished (one row per sweep, written at its end): a worker or
    beat that stopped shows as a sweep that has not run, on the board and in /metrics, instead
    of a board saying "at cap" over leases nobody reaps (chaos10)."""

    name = models.CharField(max_length=64, primary_key=True)
    finished_at = models.DateTimeField()
    # What the run did: the todos it reaped, requeued or rang for.
    count = models.IntegerField(default=0)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(name="sweep_run_name_known", condition=Q(name__in=SWEEPS)),
            models.CheckConstraint(name="sweep_run_count_not_negative", condition=Q(count__gte=0)),
        ]

    def __str__(self) -> str:
        return f"{self.name} at {self.finished_at:%Y-%m-%d %H:%M:%S}"


class HumanToken(models.Model):
    """A personal access token (sbh_…) for a human using the API; stored as a SHA-256 hash."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens"
    )
    name = models.CharField(max_length=MAX_TOKEN_NAME)
    token_hash = models.CharField(max_length=64, unique=True, editable=False)
    token_prefix = models.CharField(max_length=16, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    revoked_at = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.token_prefix}… ({self.user})"
