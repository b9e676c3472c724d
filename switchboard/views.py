"""/metrics behind a bearer token."""

from __future__ import annotations

import hmac

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_safe
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from switchboard.core.tokens import bearer_token


# A scrape reads: another method is 405 with Allow. CSRF exempt, so that answer is not the
# CSRF check's 403 (a cookie's session never reaches it: a bearer token does).
@csrf_exempt
@require_safe
def metrics_view(request: HttpRequest) -> HttpResponse:
    expected = settings.METRICS_TOKEN
    given = bearer_token(request.headers.get("Authorization", ""))
    if not expected:
        return HttpResponse("metrics are off: METRICS_TOKEN is unset\n", status=403)
    # The scheme is case-insensitive (RFC 9110 11.1): "bearer" is as good as "Bearer".
    if given is None:
        return _unauthorized("a bearer token is required (METRICS_TOKEN)", "")
    if not hmac.compare_digest(given.encode(), expected.encode()):
        return _unauthorized(
            "this bearer token is not the metrics token", ', error="invalid_token"'
        )
    return HttpResponse(generate_latest(REGISTRY), content_type=CONTENT_TYPE_LATEST)


def _unauthorized(message: str, error: str) -> HttpResponse:
    """401 saying which: no token, or the wrong one (RFC 6750 3.1's invalid_token)."""
    response = HttpResponse(message + "\n", status=401)
    response["WWW-Authenticate"] = f'Bearer realm="metrics"{error}'
    return response
