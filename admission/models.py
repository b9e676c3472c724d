"""Admission policies (a budget per queue identity) and their window counters.

Every invariant of a policy is a database constraint here and is mirrored in
``admission/schemas.py`` so a bad request is refused naming the field before the database is asked.
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.db.models import F, Q

WINDOW_START_RE = r"^([01][0-9]|2[0-3]):[0-5][0-9]$"
MAX_IN_FLIGHT = 10000
MAX_CLAIMS_PER_WINDOW = 1000000
# Stacked windows (issue 12): the first window of a policy lives in its window columns, the others
# in ``extra_windows`` (a JSON list of {limit, period, tz, start, weekday}); at most this many in all.
MAX_WINDOWS = 4
# The counter key of the first window (its columns); another window's counters are keyed by its
# definition, "period|tz|start|weekday", so removing or reordering windows never mixes counters.
PRIMARY_WINDOW_KEY = ""
# A budget's lock and its window counters are split in WINDOW_SHARDS shards (migration 0007): a
# claim far from every limit holds one shard's lock and charges that shard's counter row, so
# concurrent claims of one budget neither wait for each other nor write the same row. Each
# shard's lock is the transaction-scoped advisory lock (SHARD_LOCK_CLASS + shard,
# hashtext(policy id)). The arithmetic that makes this exact admits such a claim only when every
# limit has WINDOW_SHARDS of room (the proof is in migration 0007's header).
WINDOW_SHARDS = 8
SHARD_LOCK_CLASS = 19550  # classes 19550..19557; limits use 19536 and 19540 (limits.locks)


class WindowPeriod(models.TextChoices):
    HOUR = "hour"
    DAY = "day"
    WEEK = "week"


class Weekday(models.TextChoices):
    MON = "Mon"
    TUE = "Tue"
    WED = "Wed"
    THU = "Thu"
    FRI = "Fri"
    SAT = "Sat"
    SUN = "Sun"


class Posture(models.TextChoices):
    ENFORCE = "enforce"  # refuse over-limit claims
    ADVISE = "advise"  # admit over-limit claims with a signed waiver in the ledger
    OFF = "off"  # admit and only count


class DeferralReason(models.TextChoices):
    WINDOW_EXHAUSTED = "window_exhausted"
    IN_FLIGHT_FULL = "in_flight_full"
    PAUSED = "paused"  # a limit of 0
    ADMISSION_UNAVAILABLE = "admission_unavailable"


class AdmissionPolicy(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # No index of its own: the unique (endpoint, queue) index serves lookups by endpoint too,
    # and it is the one the claim's policy probe uses.
    endpoint = models.ForeignKey(
        "queues.Endpoint",
        on_delete=models.CASCADE,
        related_name="admission_policies",
        db_index=False,
    )
    queue = models.CharField(max_length=64)
    max_in_flight = models.IntegerField(null=True, blank=True)
    max_claims_per_window = models.IntegerField(null=True, blank=True)
    window_period = models.CharField(
        max_length=4, choices=WindowPeriod.choices, null=True, blank=True
    )
    window_tz = models.CharField(max_length=64, null=True, blank=True)
    window_start = models.CharField(max_length=5, null=True, blank=True)
    window_weekday = models.CharField(max_length=3, choices=Weekday.choices, null=True, blank=True)
    # The windows after the first: [{limit, period, tz, start, weekday}], validated in the
    # database by admission_extra_windows_valid (migration 0006).
    extra_windows = models.JSONField(default=list, blank=True)
    posture = models.CharField(max_length=7, choices=Posture.choices, default=Posture.ENFORCE)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+"
    )
    updated_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["endpoint", "queue"]
        verbose_name_plural = "admission policies"
        constraints = [
            models.UniqueConstraint(fields=["endpoint", "queue"], name="admission_policy_identity"),
            models.CheckConstraint(
                name="policy_max_in_flight_range",
                condition=Q(max_in_flight__isnull=True)
                | Q(max_in_flight__gte=0, max_in_flight__lte=MAX_IN_FLIGHT),
            ),
            models.CheckConstraint(
                name="policy_max_claims_range",
                condition=Q(max_claims_per_window__isnull=True)
                | Q(max_claims_per_window__gte=0, max_claims_per_window__lte=MAX_CLAIMS_PER_WINDOW),
            ),
            models.CheckConstraint(
                name="policy_window_period_valid",
                condition=Q(window_period__isnull=True) | Q(window_period__in=WindowPeriod.values),
            ),
            models.CheckConstraint(
                name="policy_window_start_format",
                condition=Q(window_start__isnull=True) | Q(window_start__regex=WINDOW_START_RE),
            ),
            models.CheckConstraint(
                name="policy_window_weekday_valid",
                condition=Q(window_weekday__isnull=True) | Q(window_weekday__in=Weekday.values),
            ),
            models.CheckConstraint(
                name="policy_has_a_limit",
                condition=Q(max_in_flight__isnull=False) | Q(max_claims_per_window__isnull=False),
            ),
            models.CheckConstraint(
                name="policy_window_complete",
                condition=Q(max_claims_per_window__isnull=True)
                | Q(
                    window_period__isnull=False,
                    window_tz__isnull=False,
                    window_start__isnull=False,
                ),
            ),
            # (window_period = 'week') = (window_weekday IS NOT NULL)
            models.CheckConstraint(
                name="policy_weekday_iff_week",
                condition=Q(window_period=WindowPeriod.WEEK, window_weekday__isnull=False)
                | (
                    (~Q(window_period=WindowPeriod.WEEK) | Q(window_period__isnull=True))
                    & Q(window_weekday__isnull=True)
                ),
            ),
            models.CheckConstraint(
                name="policy_posture_valid", condition=Q(posture__in=Posture.values)
            ),
            # Each stacked window's fields, no two windows alike, at most MAX_WINDOWS, only
            # after a first window: the SQL function of migration 0006.
            models.CheckConstraint(
                name="policy_extra_windows_valid",
                condition=models.Func(
                    F("extra_windows"),
                    F("max_claims_per_window"),
                    F("window_period"),
                    F("window_tz"),
                    F("window_start"),
                    F("window_weekday"),
                    function="admission_extra_windows_valid",
                    output_field=models.BooleanField(),
                ),
            ),
        ]

    def __str__(self) -> str:
        # As the ledger and the API name it (the admin's lists and messages select the endpoint).
        return f"budget on {self.scope}/{self.queue}"

    @property
    def scope(self) -> str:
        return f"endpoint:{self.endpoint.slug}"


class AdmissionWindow(models.Model):
    """The counter of one window of one policy: claims charged, and claims refused."""

    policy = models.ForeignKey(AdmissionPolicy, on_delete=models.CASCADE, related_name="windows")
    # Which of the policy's windows: PRIMARY_WINDOW_KEY for the first, else the window's definition.
    window_key = models.CharField(max_length=96, default=PRIMARY_WINDOW_KEY, blank=True)
    window_start = models.DateTimeField()
    # Which of the WINDOW_SHARDS counter rows of this window: the shard whose lock the charging
    # claim held (0 for the locked path and refusals). A window's count is the sum of its rows.
    shard = models.SmallIntegerField(default=0, db_default=0)
    used = models.IntegerField(default=0)
    refused = models.IntegerField(default=0)
    # The window limit in force at the last charge or refusal, for the history (migration 0002).
    claims_limit = models.IntegerField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["policy", "-window_start"]
        # The three CheckConstraints below are, in the database, the CHECKs of the domains
        # shard, used and refused are declared with (migration 0011: a charge then pays for
        # none it cannot break). A migration altering one of those fields puts its domain back.
        constraints = [
            models.UniqueConstraint(
                fields=["policy", "window_key", "window_start", "shard"],
                name="admission_window_key",
            ),
            models.CheckConstraint(
                name="window_shard_range", condition=Q(shard__gte=0, shard__lt=WINDOW_SHARDS)
            ),
            models.CheckConstraint(name="window_used_nonnegative", condition=Q(used__gte=0)),
            models.CheckConstraint(name="window_refused_nonnegative", condition=Q(refused__gte=0)),
        ]

    def __str__(self) -> str:
        return f"{self.policy_id} @ {self.window_start:%Y-%m-%d %H:%M} #{self.shard}"
