"""/metrics behind a bearer token."""

from __future__ import annotations

import hmac

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest


def metrics_view(request: HttpRequest) -> HttpResponse:
    expected = settings.METRICS_TOKEN
    given = request.headers.get("Authorization", "")
    if not expected:
        return HttpResponse("metrics are off: METRICS_TOKEN is unset\n", status=403)
    if not hmac.compare_digest(given.encode(), f"Bearer {expected}".encode()):
        response = HttpResponse("a bearer token is required\n", status=401)
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    return HttpResponse(generate_latest(REGISTRY), content_type=CONTENT_TYPE_LATEST)
