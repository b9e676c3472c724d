"""Input and output schemas of the budget surfaces: the operator API, the agent verbs, the CLI.

The policy inputs take their bounds and defaults from the one policy spec (``admission/policy.py``)
and mirror every database constraint (ranges, the start's format, the period and weekday choices,
a known zone), so a bad request is refused naming the field before the service is asked;
``PolicySpec.clean`` checks the cross-field rules (a window with a window limit, a
weekday exactly for a week) with the same field names, and the database remains the backstop.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal
from uuid import UUID

from ninja import Schema
from pydantic import (
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    ValidationInfo,
    field_validator,
    model_validator,
)

from admission import windows
from admission.policy import (
    DEFAULT_POSTURE,
    DEFAULT_WINDOW_START,
    MAX_CLAIMS_PER_WINDOW,
    MAX_IN_FLIGHT,
    MAX_WINDOWS,
    WINDOW_START_RE,
)
from queues.models import QUEUE_NAME_RE
from switchboard.core import validation, versions
from switchboard.core.zones import not_a_zone

PostureName = Literal["enforce", "advise", "off"]
PeriodName = Literal["hour", "day", "week"]
WeekdayName = Literal["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"]
ReasonName = Literal["window_exhausted", "in_flight_full", "paused", "admission_unavailable"]

# Policy writes are small; a larger body is refused before it is parsed (HTTP 413).
POLICY_BODY_LIMIT = 16 * 1024


class Strict(Schema):
    """An input: unknown keys refused, no coercion (``true`` is not 1, ``"3"`` not a number)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    @model_validator(mode="wrap")
    @classmethod
    def _run_root_validator(
        cls, values: Any, handler: ModelWrapValidatorHandler[Any], info: ValidationInfo
    ) -> Any:
        """Validated once, as itself (``queues.schemas.Strict`` says why)."""
        return handler(validation.integral_numbers(cls, values))


# --- inputs ---------------------------------------------------------------------------------------


class WindowIn(Strict):
    period: PeriodName
    tz: str = Field(min_length=1, max_length=64, description="An IANA zone, e.g. Europe/Berlin")
    start: str = Field(
        default=DEFAULT_WINDOW_START,
        pattern=WINDOW_START_RE,
        description="Local HH:MM of the boundary; for an hour window only the minutes count",
    )
    weekday: WeekdayName | None = Field(
        default=None, description="Required for, and only for, week"
    )

    @field_validator("tz")
    @classmethod
    def _known_zone(cls, value: str) -> str:
        if not windows.zone_exists(value):
            raise ValueError(not_a_zone(value))
        return value


class WindowLimitIn(WindowIn):
    """One of stacked windows: at most ``limit`` claims per this window."""

    limit: int = Field(ge=0, le=MAX_CLAIMS_PER_WINDOW, strict=True)


class PolicyIn(Strict):
    """A whole budget (a PUT replaces everything; an absent limit is no limit).

    It names at least one limit: ``max_in_flight``, window limits, or both. Window limits come
    either as ``windows`` (stacked: every one charged and enforced on each claim) or as the
    single ``max_claims_per_window`` per ``window`` (a one-item list), not both."""

    max_in_flight: int | None = Field(default=None, ge=0, le=MAX_IN_FLIGHT, strict=True)
    max_claims_per_window: int | None = Field(
        default=None, ge=0, le=MAX_CLAIMS_PER_WINDOW, strict=True
    )
    window: WindowIn | None = None
    windows: list[WindowLimitIn] | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_WINDOWS,
        description="Stacked window limits, e.g. 100 per hour and 1000 per day; no two alike",
    )
    posture: PostureName = Field(
        default=DEFAULT_POSTURE,
        description="enforce refuses over-limit claims; advise admits them with a signed waiver "
        "in the ledger; off admits and only counts",
    )

    def service_kwargs(self) -> dict[str, Any]:
        """The arguments of ``policy_set`` / ``PolicySpec.clean`` (admission/policy.py)."""
        kwargs: dict[str, Any] = {
            "max_in_flight": self.max_in_flight,
            "max_claims_per_window": self.max_claims_per_window,
            "window": self.window.model_dump() if self.window is not None else None,
            "posture": self.posture,
        }
        if self.windows is not None:
            kwargs["windows"] = [w.model_dump() for w in self.windows]
        return kwargs


class AdmissionStatusIn(Strict):
    queue: str | None = Field(
        default=None, pattern=QUEUE_NAME_RE, max_length=64, description="One scoped queue"
    )


def IfVersion(more: str = "") -> Any:
    """A budget write's condition: the ``version`` the caller read (``admission_status`` gives
    it). Left out, the write is unconditional, as it always was."""
    return Field(
        default=None,
        pattern=rf"^([0-9a-f]{{20}}|{versions.NONE_NAMED})$",
        description="Write only over this version of the budget (its `version`, as "
        "admission_status shows it); if the budget changed since, nothing is written "
        "(precondition_failed, with the version now)" + more,
    )


class SetAdmissionPolicyIn(Strict):
    queue: str = Field(pattern=QUEUE_NAME_RE, min_length=1, max_length=64)
    policy: PolicyIn
    if_version: str | None = IfVersion("; none: only where there is no budget yet")


class ClearAdmissionPolicyIn(Strict):
    queue: str = Field(pattern=QUEUE_NAME_RE, min_length=1, max_length=64)
    if_version: str | None = IfVersion()


# --- outputs --------------------------------------------------------------------------------------


class WindowOut(Schema):
    period: PeriodName
    tz: str | None
    start: str | None
    weekday: WeekdayName | None = None
    description: str | None = Field(
        default=None, description="e.g. 'per day from 00:00 Europe/Berlin'"
    )


class WindowLimitOut(WindowOut):
    limit: int


class WindowUseOut(Schema):
    """One window limit now: its definition, counter and bounds."""

    limit: int
    period: PeriodName
    tz: str | None
    start: str | None
    weekday: WeekdayName | None = None
    description: str | None = None
    used: int
    remaining: int
    window_start: datetime
    window_resets_at: datetime
    key: str = Field(default="", description="Its counter: empty for the first window")
    binding: bool = Field(
        default=False, description="The window that holds a window_exhausted claim"
    )


class PolicyOut(Schema):
    scope: str = Field(description="endpoint:<slug>")
    endpoint: str
    endpoint_id: UUID
    queue: str
    max_in_flight: int | None
    max_claims_per_window: int | None
    window: WindowOut | None = Field(description="The first window (see windows)")
    windows: list[WindowLimitOut] = Field(
        default_factory=list, description="Every window limit, the first one first"
    )
    posture: PostureName
    created_at: datetime
    updated_at: datetime
    updated_by: str
    version: str = Field(
        description="The budget's version: changes with every write that changes it. The REST "
        "API sends it as the ETag; give it back in If-Match to write only over what you read"
    )


class StatusOut(Schema):
    state: Literal["admitted", "deferred"]
    reason: ReasonName | None = None
    next_eligible_at: datetime | None = None
    exact: bool
    window: WindowUseOut | None = Field(
        default=None,
        description="window_exhausted: the window that holds the claim until next_eligible_at "
        "(of the exhausted windows, the one that resets last)",
    )


class UsageOut(Schema):
    max_in_flight: int | None
    in_flight: int
    max_claims_per_window: int | None
    used: int | None = Field(description="Claims charged in the current window")
    remaining: int | None
    window_start: datetime | None
    window_resets_at: datetime | None
    over_limit: bool = Field(
        description="True when one more claim would go over a limit (a window used up, every "
        "in-flight slot taken): enforce defers it; advise and off admit it"
    )
    windows: list[WindowUseOut] = Field(
        default_factory=list, description="Every window limit now, the first one first"
    )


class PolicyStatusOut(Schema):
    policy: PolicyOut
    status: StatusOut
    usage: UsageOut


class PolicyListOut(Schema):
    policies: list[PolicyStatusOut]


class WindowHistoryOut(Schema):
    window_key: str = Field(
        default="", description="Which window: empty for the first, else period|tz|start|weekday"
    )
    window_start: datetime
    used: int
    refused: int
    limit: int | None = Field(description="The window limit in force at its last claim")


class LedgerRowOut(Schema):
    seq: int
    kind: str
    at: datetime
    actor_human: str | None
    actor_endpoint: str | None
    scope: str
    queue: str
    before: dict[str, Any] | None
    after: dict[str, Any] | None
    entry_hash: str


class PolicyDetailOut(PolicyStatusOut):
    windows: list[WindowHistoryOut] = Field(description="The last 30 windows, newest first")
    audit: list[LedgerRowOut] = Field(description="Ledger rows of this budget, newest first")


class QueueAdmissionOut(Schema):
    queue: str
    policy: PolicyOut | None
    status: StatusOut
    usage: UsageOut | None


class AdmissionStatusOut(Schema):
    queues: list[QueueAdmissionOut]


class PolicyEnvelopeOut(Schema):
    queue: str
    policy: PolicyOut | None = Field(description="The budget now; null after a clear")
    status: StatusOut
    usage: UsageOut | None
