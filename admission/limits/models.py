"""Named limits: pools, tag limits, rate limits and queue settings.

Global declarations (not per endpoint): a todo names them at intake and the claim enforces them.
Every invariant is a database constraint as well as an edge check (``admission.limits.services``).
A pool's slots or a tag's limit of 0 means quarantined.
"""

from __future__ import annotations

from django.db import models
from django.db.models import F, Q

from queues.models import LIMIT_NAME_RE, QUEUE_NAME_RE

DEFAULT_DECAY_WINDOW_SECONDS = 300
MAX_LIMIT = 1_000_000
MAX_DECAY_WINDOW_SECONDS = 86_400
# Halvings per 429 observed: 1 halves the limit per observation (the default), 2 quarters it,
# 0 turns decay off.
DEFAULT_DECAY_STEP = 1
MAX_DECAY_STEP = 16


class LimitPosture(models.TextChoices):
    ENFORCE = "enforce"  # refuse a claim over the limit
    ADVISE = "advise"  # admit it, with an HMAC-signed waiver in the ledger
    OFF = "off"  # inert


class _Declared(models.Model):
    """What every declared limit has: a posture and its times."""

    posture = models.CharField(
        max_length=8, choices=LimitPosture.choices, default=LimitPosture.ENFORCE
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        abstract = True


def _posture_valid(model: str) -> models.CheckConstraint:
    return models.CheckConstraint(
        name=f"{model}_posture_valid", condition=Q(posture__in=LimitPosture.values)
    )


class Pool(_Declared):
    name = models.CharField(max_length=64, unique=True)
    slots = models.IntegerField()

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(name="pool_name_format", condition=Q(name__regex=LIMIT_NAME_RE)),
            models.CheckConstraint(
                name="pool_slots_range", condition=Q(slots__gte=0, slots__lte=MAX_LIMIT)
            ),
            _posture_valid("pool"),
        ]

    def __str__(self) -> str:
        return f"pool {self.name} ({self.slots} slots, {self.posture})"


class TagLimit(_Declared):
    tag = models.CharField(max_length=64, unique=True)
    limit = models.IntegerField()

    class Meta:
        ordering = ["tag"]
        constraints = [
            models.CheckConstraint(
                name="taglimit_tag_format", condition=Q(tag__regex=LIMIT_NAME_RE)
            ),
            models.CheckConstraint(
                name="taglimit_limit_range", condition=Q(limit__gte=0, limit__lte=MAX_LIMIT)
            ),
            _posture_valid("taglimit"),
        ]

    def __str__(self) -> str:
        return f"tag {self.tag} (limit {self.limit}, {self.posture})"


class RateLimit(_Declared):
    name = models.CharField(max_length=64, unique=True)
    base_limit = models.IntegerField()  # claims per minute with no 429 in the decay window
    floor = models.IntegerField(default=1)
    decay_window_seconds = models.IntegerField(default=DEFAULT_DECAY_WINDOW_SECONDS)
    decay_step = models.IntegerField(default=DEFAULT_DECAY_STEP)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(
                name="ratelimit_name_format", condition=Q(name__regex=LIMIT_NAME_RE)
            ),
            models.CheckConstraint(
                name="ratelimit_base_range",
                condition=Q(base_limit__gte=1, base_limit__lte=MAX_LIMIT),
            ),
            models.CheckConstraint(
                name="ratelimit_floor_range", condition=Q(floor__gte=1, floor__lte=F("base_limit"))
            ),
            models.CheckConstraint(
                name="ratelimit_decay_window_range",
                condition=Q(
                    decay_window_seconds__gte=1, decay_window_seconds__lte=MAX_DECAY_WINDOW_SECONDS
                ),
            ),
            models.CheckConstraint(
                name="ratelimit_decay_step_range",
                condition=Q(decay_step__gte=0, decay_step__lte=MAX_DECAY_STEP),
            ),
            _posture_valid("ratelimit"),
        ]

    def __str__(self) -> str:
        return f"rate limit {self.name} (base {self.base_limit}/min, floor {self.floor})"


class QueueSettings(models.Model):
    """A queue name's priority in claim_next (higher first), aged by waiting time."""

    queue = models.CharField(max_length=64, unique=True)
    priority = models.IntegerField(default=0)
    aging_seconds = models.IntegerField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["queue"]
        verbose_name_plural = "queue settings"
        constraints = [
            models.CheckConstraint(
                name="queuesettings_queue_format", condition=Q(queue__regex=QUEUE_NAME_RE)
            ),
            models.CheckConstraint(
                name="queuesettings_priority_range",
                condition=Q(priority__gte=-MAX_LIMIT, priority__lte=MAX_LIMIT),
            ),
            models.CheckConstraint(
                name="queuesettings_aging_positive",
                condition=Q(aging_seconds__isnull=True) | Q(aging_seconds__gte=1),
            ),
        ]

    def __str__(self) -> str:
        return f"queue {self.queue} (priority {self.priority})"


class RateObservation(models.Model):
    """One 429 met by work naming a rate limit. The effective limit is read from these rows,
    never cached: max(floor, base >> observations within the decay window)."""

    rate_limit = models.ForeignKey(RateLimit, on_delete=models.CASCADE, related_name="observations")
    observed_at = models.DateTimeField()
    endpoint_id = models.UUIDField(null=True, blank=True)
    todo_id = models.UUIDField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["rate_limit", "observed_at"], name="rateobs_window_idx")]

    def __str__(self) -> str:
        return f"429 on rate limit {self.rate_limit_id} at {self.observed_at.isoformat()}"


class RateMinute(models.Model):
    """Claims admitted per rate limit per minute, charged under the rate limit's row lock."""

    rate_limit = models.ForeignKey(RateLimit, on_delete=models.CASCADE, related_name="minutes")
    minute = models.DateTimeField()
    used = models.IntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["rate_limit", "minute"], name="rateminute_unique"),
            models.CheckConstraint(name="rateminute_used_nonnegative", condition=Q(used__gte=0)),
        ]

    def __str__(self) -> str:
        return f"{self.used} claims at {self.minute.isoformat()} on rate limit {self.rate_limit_id}"
