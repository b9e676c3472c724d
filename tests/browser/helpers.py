"""Helpers for the browser tests: budgets and API calls against the live server."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

from admission import services as admission_services
from admission.models import AdmissionPolicy
from tests.conftest import Personas


def budget(
    p: Personas,
    queue: str = "inbox",
    *,
    max_in_flight: int | None = None,
    max_claims_per_window: int | None = None,
    tz: str = "America/Los_Angeles",
    posture: str = "enforce",
) -> AdmissionPolicy:
    """A budget on the owner's endpoint ``agent``, set through the service."""
    window = None
    if max_claims_per_window is not None:
        window = {"period": "day", "tz": tz, "start": "00:00"}
    return admission_services.policy_set(
        actor=p.as_human(),
        endpoint=p.agent,
        queue=queue,
        max_in_flight=max_in_flight,
        max_claims_per_window=max_claims_per_window,
        window=window,
        posture=posture,
    )


def api_post(base: str, path: str, token: str, body: dict[str, Any] | None = None) -> Any:
    """POST JSON to the live server's API with a bearer token (as an agent would)."""
    request = urllib.request.Request(
        base + path,
        data=json.dumps(body or {}).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())
