"""The operators' queue API: ``GET /queues``, ``POST /queues/{queue}/pause`` and ``/resume``.

Humans only (session or ``sbh_`` token): an agent's ``sbk_`` token is refused with 401, and no
MCP verb pauses a queue. Mounted on the one NinjaAPI at /api/v1. Handlers are thin: the reads come
from ``queues.selectors.queue_stats`` and the writes from ``queues.pauses``; refusals are raised
as domain errors and mapped once in ``switchboard/api.py``.
"""

from __future__ import annotations

from django.http import HttpRequest
from ninja import Field, Router, Schema

from queues import pauses, selectors
from queues.access import HumanActor
from queues.auth import HumanAuth
from queues.conditions import Condition
from queues.schemas import NOT_BLANK, PauseInfoOut, Strict
from switchboard.core.http import ErrorOut

router = Router(tags=["queues"], auth=HumanAuth())


class QueueCountsOut(Schema):
    pending: int
    claimed: int
    done: int
    failed: int


class QueueOut(Schema):
    queue: str
    counts: QueueCountsOut
    dead_letter: int = Field(description="Failed todos with no retry left.")
    oldest_pending_seconds: float | None = Field(
        description="Age of the oldest pending todo, or null when none is pending."
    )
    paused: PauseInfoOut | None = Field(description="The pause, or null when the queue is live.")
    condition: Condition = Field(
        description="The queue's worst condition across its endpoints: the word the console shows."
    )
    conditions: list[Condition] = Field(description="Every condition that holds, worst first.")


class QueueListOut(Schema):
    queues: list[QueueOut]


class PauseIn(Strict):
    reason: str = Field(min_length=1, max_length=pauses.MAX_REASON, json_schema_extra=NOT_BLANK)
    create: bool = Field(
        default=False, description="Pause a name no todo, policy or endpoint has used yet."
    )


class PauseOut(Schema):
    queue: str
    paused: bool
    changed: bool = Field(description="False when the queue was already paused.")
    pause: PauseInfoOut


class ResumeOut(Schema):
    queue: str
    resumed: bool = Field(description="False when the queue was not paused.")
    lifted: PauseInfoOut | None
    woken: list[str] = Field(description="Endpoints rung because they hold pending todos.")
    held: list[str] = Field(
        description="Endpoints holding pending todos that were not rung: their budget or a "
        "named limit still holds them (rung, reason reopened, when it frees)."
    )


ERRORS_READ: dict[int, type[Schema]] = {401: ErrorOut, 403: ErrorOut}
ERRORS_WRITE: dict[int, type[Schema]] = {
    400: ErrorOut,
    401: ErrorOut,
    403: ErrorOut,
    404: ErrorOut,
    409: ErrorOut,
}


@router.get("/queues", response={200: QueueListOut, **ERRORS_READ}, summary="List known queues")
def list_queues(request: HttpRequest) -> QueueListOut:
    """Every known queue with counts by state, dead letters, the oldest pending age and its
    pause. Owners see their endpoints' queues; superusers, auditors and pausers see the fleet.
    A paused queue is always listed, even when it holds no todos."""
    actor: HumanActor = request.auth  # type: ignore[attr-defined]
    stats = selectors.queue_overview(actor=actor)
    return QueueListOut(
        queues=[
            QueueOut(
                queue=s.queue,
                counts=QueueCountsOut(**s.counts),
                dead_letter=s.dead_letter,
                oldest_pending_seconds=s.oldest_pending_seconds,
                paused=_pause_out(s.paused) if s.paused else None,
                condition=s.condition,
                conditions=s.conditions,
            )
            for s in stats
        ]
    )


@router.post(
    "/queues/{queue}/pause", response={200: PauseOut, **ERRORS_WRITE}, summary="Pause a queue"
)
def pause_queue(request: HttpRequest, queue: str, payload: PauseIn) -> PauseOut:
    """Stop handing out the queue's todos, fleet-wide; intake continues. Needs the
    queues.pause_queue permission. Pausing a paused queue changes nothing (`changed: false`)."""
    result = pauses.queue_pause(
        actor=request.auth,  # type: ignore[attr-defined]
        queue=queue,
        reason=payload.reason,
        create=payload.create,
    )
    return PauseOut(
        queue=result.queue, paused=True, changed=result.changed, pause=_pause_out(result.pause)
    )


@router.post(
    "/queues/{queue}/resume", response={200: ResumeOut, **ERRORS_WRITE}, summary="Resume a queue"
)
def resume_queue(request: HttpRequest, queue: str) -> ResumeOut:
    """Lift the pause and ring once for each endpoint with pending todos (reason `resumed`).
    Resuming a queue that is not paused answers `resumed: false`."""
    result = pauses.queue_resume(actor=request.auth, queue=queue)  # type: ignore[attr-defined]
    return ResumeOut(
        queue=result.queue,
        resumed=result.resumed,
        lifted=_pause_out(result.lifted) if result.lifted else None,
        woken=result.woken,
        held=result.held,
    )


def _pause_out(info: selectors.PauseInfo) -> PauseInfoOut:
    return PauseInfoOut(reason=info.reason, by=info.by, at=info.at)
