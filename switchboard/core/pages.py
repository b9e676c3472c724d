"""Helpers every console page shares, whichever app serves it."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from functools import wraps
from typing import Any

from django.contrib.auth.decorators import login_required
from django.contrib.auth.views import redirect_to_login
from django.http import HttpRequest, HttpResponse
from django.http.response import HttpResponseBase
from django.shortcuts import render
from django.utils.http import url_has_allowed_host_and_scheme
from django_htmx.http import HttpResponseClientRedirect
from django_htmx.middleware import HtmxDetails

from switchboard.core.errors import DomainError, Forbidden, InvalidArgument

LOGIN = "login"
# The cookie that carries the viewer's zone (an IANA name).
TZ_COOKIE = "tz"


class HtmxHttpRequest(HttpRequest):
    """A request through django-htmx's middleware (``request.htmx``)."""

    htmx: HtmxDetails


def console_login_required(
    view: Callable[..., HttpResponseBase],
) -> Callable[..., HttpResponseBase]:
    """Signed in, or to the sign-in page. A fragment request (htmx) is told to load the sign-in
    page as the whole page, coming back to the page the viewer was on: a redirect would be
    followed by the browser's request and the sign-in page swapped into the drawer or list."""
    page_view = login_required(view, login_url=LOGIN)

    @wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        htmx = getattr(request, "htmx", None)
        if not htmx or request.user.is_authenticated:
            return page_view(request, *args, **kwargs)
        back = htmx.current_url_abs_path or request.get_full_path()
        return HttpResponseClientRedirect(redirect_to_login(back, LOGIN)["Location"])

    return wrapped


def safe_next(request: HttpRequest, fallback: str) -> str:
    """The ``next`` the form carried, if it is a path on this site; else the fallback."""
    target = request.POST.get("next") or request.GET.get("next") or ""
    if target and url_has_allowed_host_and_scheme(
        target, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return target
    return fallback


def refusal(request: HttpRequest, exc: DomainError) -> HttpResponse:
    """A refusal the page cannot show inline: 400 (a request it cannot read, the field named),
    403 and 404 as pages of their own."""
    status = 403 if isinstance(exc, Forbidden) else 400 if isinstance(exc, InvalidArgument) else 404
    template = "error.html#message" if getattr(request, "htmx", False) else "error.html"
    return render(request, template, {"error": exc.message, "status": status}, status=status)


def identity_key(slug: str, queue: str) -> str:
    """A stable HTML id for a queue identity: ``<slug>--<queue>``, made id- and CSS-safe."""
    if re.fullmatch(r"[A-Za-z0-9_-]+", queue):
        return f"{slug}--{queue}"
    digest = hashlib.sha1(queue.encode()).hexdigest()[:6]
    return f"{slug}--{re.sub(r'[^A-Za-z0-9_-]', '_', queue)}-{digest}"


def isolated(text: str) -> str:
    """Someone else's words inside a sentence of ours, as plain text (a flash message): wrapped
    in FIRST STRONG ISOLATE ... POP DIRECTIONAL ISOLATE, so a bidi control in them (an agent's
    right-to-left override in a title) cannot reorder the rest of the sentence. In HTML the
    templates use <bdi>; a message is escaped text, so it carries the isolate itself."""
    return f"\u2068{text}\u2069"
