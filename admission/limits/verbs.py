"""The agent's limits verbs, served as REST routes and MCP tools (switchboard/core/verbs.py):

- ``report_rate_limited {rate_limit}``: its own family, never in the basic grant;
- ``limits_status {}``: every declared limit and how full it is now (the operator API's list),
  riding on the drain grant as ``admission_status`` does.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from admission.limits import rates, selectors
from admission.limits.api import LimitOut
from queues.access import AgentActor
from queues.models import LIMIT_NAME_RE
from queues.schemas import Schema, Strict
from switchboard.core.verbs import Hints, verb


class ReportRateLimitedIn(Strict):
    rate_limit: str = Field(pattern=LIMIT_NAME_RE, max_length=64)


class RateLimitOut(Schema):
    rate_limit: str
    base_limit: int
    floor: int
    effective_limit: int
    observations: int
    decay_window_seconds: int
    decay_step: int


@verb(
    "report_rate_limited",
    input=ReportRateLimitedIn,
    output=RateLimitOut,
    description="Report a 429 met by work naming a rate limit: it halves the limit's claims "
    "per minute (down to its floor) for the decay window, for every agent naming it.",
)
def report_rate_limited(actor: AgentActor, data: ReportRateLimitedIn) -> dict[str, Any]:
    rates.observe(rate_limit=data.rate_limit, actor=actor)
    st = rates.state(data.rate_limit)
    assert st is not None
    return {
        "rate_limit": st.name,
        "base_limit": st.base_limit,
        "floor": st.floor,
        "effective_limit": st.effective,
        "observations": st.observations,
        "decay_window_seconds": st.decay_window_seconds,
        "decay_step": st.decay_step,
    }


class LimitsStatusIn(Strict):
    """No arguments."""


class LimitsStatusOut(Schema):
    limits: list[LimitOut]


@verb(
    "limits_status",
    hints=Hints(read_only=True),
    input=LimitsStatusIn,
    output=LimitsStatusOut,
    description="Every pool, tag limit and rate limit of the fleet: its posture and size, the "
    "claims naming it now (held), and for a rate limit its effective claims per minute.",
)
def limits_status(actor: AgentActor, data: LimitsStatusIn) -> dict[str, Any]:
    return {"limits": selectors.limits_status()}
