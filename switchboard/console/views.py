"""The console pages: the board, queues and pauses, the todo drawer (they show both apps' state).

Every view is a thin caller: filters and forms in, one selector or service call, render or
redirect. One URL serves the full page and, for htmx, the fragment it targets (``request.htmx``
with ``{% partialdef %}``); every hx- action sits on a real form or link, and without JavaScript
a post redirects (post/redirect/get). Domain refusals are mapped to page messages here, once.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from django import forms
from django.contrib import messages
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.utils.http import urlencode
from django.views.decorators.http import require_http_methods, require_POST, require_safe
from django_htmx.http import reswap, retarget

from admission import selectors as admission_selectors
from admission.limits import selectors as limit_selectors
from queues import activity, conditions, pauses, selectors, services
from queues.access import Viewer, refuse_auditors, visible_endpoints
from queues.conditions import Condition
from queues.forms import PauseForm, TimezoneForm, TodoCompleteForm, TodoFailForm
from queues.models import QUARANTINE_QUEUE, TodoState, check_queue_name
from queues.pauses import MAX_REASON
from switchboard.console import board, charts, live
from switchboard.console.board import Filters
from switchboard.console.templatetags.console import at_zone, stamp
from switchboard.core.errors import DomainError, Forbidden, InvalidArgument, NotFound
from switchboard.core.pages import (
    TZ_COOKIE,
    HtmxHttpRequest,
    console_login_required,
    isolated,
    refusal,
    safe_next,
)
from switchboard.core.validation import MAX_JSON_BYTES
from switchboard.core.zones import not_a_zone, zone_exists, zones

TZ_COOKIE_AGE = 365 * 24 * 3600
# The session key of a pause refused without htmx, until the queue page shows it; the reason
# typed is kept up to KEPT_REASON characters (twice the most a reason may have).
PAUSE_REFUSED = "console.pause_refused"
KEPT_REASON = 2 * MAX_REASON
# The same for a todo's Complete or Fail refused (by the form or the service): what was typed in
# each field, up to KEPT_TEXT characters (twice the most a stored JSON field may take), and
# the refusal beside the field it names, until the todo's page or drawer shows them.
TODO_REFUSED = "console.todo_refused"
KEPT_TEXT = 2 * MAX_JSON_BYTES
TYPED = {"complete": ("summary", "result"), "fail": ("error",)}
TODO_ACTIONS = ("claim", "complete", "fail", "release", "retry", "discard")


# --- the board ----------------------------------------------------------------------------------


def board_context(request: HttpRequest, viewer: Viewer, filters: Filters) -> dict[str, Any]:
    view = board.board_view(viewer, filters)
    here = request.path + (f"?{filters.query()}" if filters.query() else "")
    return {
        "viewer": viewer,
        "filters": filters,
        "view": view,
        "sections": view.sections,
        "conditions": Condition.choices,
        "here": here,
        "state_choices": board.STATE_CHOICES,
        "endpoints": view.endpoints
        if view.endpoints is not None
        else visible_endpoints(viewer.actor),
        "queue_names": view.queue_names
        if view.queue_names is not None
        else board.visible_queue_names(viewer),
        "live_url": live.live_url(viewer, filters, here),
        "nav": "board",
    }


@require_safe
@console_login_required
def board_view(request: HtmxHttpRequest) -> HttpResponse:
    viewer = Viewer.of(request)
    try:
        filters = Filters.from_query(request.GET)
    except InvalidArgument as exc:  # a typed or stale link: named, never widened to "all"
        return refusal(request, exc)
    context = board_context(request, viewer, filters)
    if request.htmx and request.htmx.target == "sections":
        return render(request, "queues/board.html#sections", context)
    return render(request, "queues/board.html", context)


# --- queues and pauses --------------------------------------------------------------------------


@require_safe
@console_login_required
def queue_list_view(request: HttpRequest) -> HttpResponse:
    viewer = Viewer.of(request)
    stats = board.queue_list(viewer)
    return render(
        request,
        "queues/queues.html",
        {
            "viewer": viewer,
            "stats": stats,
            "fleet": board.pause_fleet_view(viewer),
            "nav": "queues",
        },
    )


def _queue_context(
    request: HttpRequest,
    viewer: Viewer,
    name: str,
    pause_form: PauseForm | None = None,
    next_url: str | None = None,
) -> dict[str, Any]:
    filters = Filters(queue=name)
    view = board.board_view(viewer, filters)
    found = view.sections
    pause = selectors.pause_of(name)
    here = reverse("queue", args=[name])
    return {
        "viewer": viewer,
        "queue": name,
        "sections": found,
        "view": view,
        "condition": conditions.worst(c for s in found for c in s.conditions),
        "filters": filters,
        "pause": pause,
        "fleet_in_flight": board.in_flight_on(name),
        "quarantine": name == QUARANTINE_QUEUE,
        "pause_form": pause_form or PauseForm(),
        "here": here,
        # Where the pause form returns: the page it was first posted from, kept across an error.
        "pause_next": next_url or here,
        "live_url": live.live_url(viewer, filters, here),
        "nav": "queues",
    }


@require_safe
@console_login_required
def queue_view(request: HtmxHttpRequest, name: str) -> HttpResponse:
    viewer = Viewer.of(request)
    try:
        check_queue_name(name)
    except InvalidArgument as exc:
        return refusal(request, NotFound(exc.message))
    refused = None if request.htmx else _refused_pause_form(request, name)
    back = safe_next(request, "") or None  # where a refused pause's form returns
    context = _queue_context(request, viewer, name, pause_form=refused, next_url=back)
    if not context["sections"] and not context["pause"] and not board.pause_fleet_view(viewer):
        return refusal(request, NotFound(f"no queue named {name!r} is visible to you"))
    if request.htmx and request.htmx.target == "sections":
        # The list with the pause panel above it (out of band): a pause or resume in a section
        # changes both.
        return render(request, "queues/queue.html#changed", context)
    if request.htmx and request.htmx.target == "queue-pause":  # the live board asks (live.js)
        return render(request, "queues/queue.html#panel", context)
    return render(request, "queues/queue.html", context)


@require_POST
@console_login_required
@refuse_auditors
def queue_pause_view(request: HtmxHttpRequest, name: str) -> HttpResponse:
    viewer = Viewer.of(request)
    form = PauseForm(request.POST)
    reason = request.POST.get("reason", "")
    form_id = request.POST.get("form_id", "")
    try:
        result = pauses.queue_pause(actor=viewer.actor, queue=name, reason=reason)
    except (Forbidden, NotFound) as exc:
        return refusal(request, exc)
    except DomainError as exc:
        return _pause_refused(request, viewer, name, form, exc, form_id)
    if result.changed:
        messages.success(request, f"Paused {name}: no todo on it is handed out until resumed.")
    else:
        messages.info(request, f"{name} was already paused by {result.pause.by}.")
    return HttpResponseRedirect(safe_next(request, reverse("queue", args=[name])))


def _pause_refused(
    request: HtmxHttpRequest,
    viewer: Viewer,
    name: str,
    form: PauseForm,
    exc: DomainError,
    form_id: str,
) -> HttpResponse:
    """The pause form again, the error beside the reason and the text kept.

    With htmx, only the form that posted is swapped. Without, the queue page shows it: by a
    redirect (post/redirect/get), the refusal kept in the session until that page shows it, so
    the browser is not left on the pause URL, which takes only posts (a reload would post again).
    """
    field = "reason" if getattr(exc, "field", "") == "reason" else None
    back = safe_next(request, reverse("queue", args=[name]))
    if request.htmx and form_id:
        # The service's words alone: the form's own check of the same rule would say it twice.
        form.errors.clear()
        form.add_error(field, exc.message)
        context = {"queue": name, "form": form, "form_id": form_id, "next": back, "viewer": viewer}
        response = render(request, "queues/_section.html#pause_form", context)
        return reswap(retarget(response, f"#{form_id}"), "outerHTML")
    if field is None:  # not the reason's fault (quarantine, a conflict): the page's message
        messages.error(request, exc.message)
    _keep_refused(
        request,
        PAUSE_REFUSED,
        name,
        reason=request.POST.get("reason", "")[:KEPT_REASON],
        error=exc.message if field else "",
    )
    here = reverse("queue", args=[name])
    # The way back rides in the address, so it outlives a reload of the page.
    return HttpResponseRedirect(here if back == here else f"{here}?{urlencode({'next': back})}")


def _keep_refused(request: HttpRequest, key: str, subject: str, **kept: Any) -> None:
    """What a refused form held, kept in the session under ``key`` for the page of ``subject``
    (a queue, a todo) that the refusal redirects to (post/redirect/get): ``_refused_for``."""
    request.session[key] = {"subject": subject, **kept}


def _refused_for(request: HttpRequest, key: str, subject: str) -> dict[str, Any] | None:
    """What ``_keep_refused`` kept for ``subject``'s page, once; None for any other page."""
    refused = request.session.get(key)
    if not isinstance(refused, dict) or refused.get("subject") != subject:
        return None
    del request.session[key]
    return refused


def _refused_pause_form(request: HttpRequest, name: str) -> PauseForm | None:
    """The pause form a refusal without htmx left for this queue's page, shown once."""
    refused = _refused_for(request, PAUSE_REFUSED, name)
    if refused is None:
        return None
    form = PauseForm({"reason": refused.get("reason", "")})
    form.errors.clear()  # the service's words alone, as with htmx
    if refused.get("error"):
        form.add_error("reason", refused["error"])
    return form


@require_POST
@console_login_required
@refuse_auditors
def queue_resume_view(request: HttpRequest, name: str) -> HttpResponse:
    viewer = Viewer.of(request)
    try:
        result = pauses.queue_resume(actor=viewer.actor, queue=name)
    except (Forbidden, NotFound) as exc:
        return refusal(request, exc)
    except DomainError as exc:
        messages.error(request, exc.message)
        return HttpResponseRedirect(safe_next(request, reverse("queue", args=[name])))
    if result.resumed and result.held and not result.woken:
        messages.warning(
            request,
            f"Resumed {name}, but nothing is handed out yet: its pending todos are still held "
            f"by a budget or a named limit ({', '.join(result.held)}); agents are rung when it "
            "frees.",
        )
    elif result.resumed and result.held:
        messages.success(
            request,
            f"Resumed {name}: its todos are handed out again, except on "
            f"{', '.join(result.held)}, still held by a budget or a named limit.",
        )
    elif result.resumed:
        messages.success(request, f"Resumed {name}: its todos are handed out again.")
    else:
        messages.info(request, f"{name} was not paused.")
    return HttpResponseRedirect(safe_next(request, reverse("queue", args=[name])))


# --- the todo drawer and its actions ------------------------------------------------------------


def _todo_context(request: HttpRequest, viewer: Viewer, todo_id: UUID) -> dict[str, Any]:
    todo = selectors.todo_get(actor=viewer.actor, todo_id=todo_id)
    attempts = selectors.todo_attempts(todo)
    chips = selectors.admission_for([todo])
    policy_status = None
    evaluation = admission_selectors.identity_status(todo.endpoint_id, todo.queue)
    if evaluation is not None:
        policy_status = {
            "status": admission_selectors.status(evaluation),
            "usage": admission_selectors.usage(evaluation),
            "posture": evaluation.policy.posture,
        }
    pause = selectors.pause_of(todo.queue)
    can_act = viewer.can_act(todo.endpoint)
    actions = _actions_for(todo.state, todo.dead_letter) if can_act else []
    if not can_act and viewer.actor.may_change(todo.endpoint):
        # A revoked endpoint's dead letters: the service still discards them (a retry is
        # refused below, saying why), as the board's bulk discard does.
        actions = [
            a for a in _actions_for(todo.state, todo.dead_letter) if a in selectors.BULK_ACTIONS
        ]
    # A lapsed lease: complete and fail are refused (lease_lapsed), only a release is not.
    if todo.lease_lapsed:
        actions = [a for a in actions if a == "release"]
    # A retry the service would refuse is not offered; the page says why instead.
    retry_refusal = selectors.retry_refusal(todo) if "retry" in actions else None
    if retry_refusal is not None:
        actions.remove("retry")
    # Nor a claim on a paused queue (the Admission section shows the pause), nor one a gate
    # holds now (a budget, a named limit): the claim would be refused, as the page says.
    explain = selectors.todo_explain(todo)
    held_by = explain.binding if explain is not None and pause is None else None
    if (pause is not None or held_by is not None) and "claim" in actions:
        actions.remove("claim")
    back = safe_next(request, reverse("board"))
    return {
        "viewer": viewer,
        "todo": todo,
        "attempts": attempts,
        "admission": chips.get(todo.id),
        "policy_status": policy_status,
        "pause": pause,
        "explain": explain,
        "held_by": held_by,
        "can_act": can_act,
        "actions": actions,
        "retry_refusal": retry_refusal.message if retry_refusal else "",
        "here": back,
        # Actions come back here (the drawer with htmx, the page without), keeping the way back.
        "self_url": reverse("todo", args=[todo.id]) + "?" + urlencode({"next": back}),
        "kept": _kept_typing(request, todo.id),
    }


def _not_done(
    request: HttpRequest, todo_id: UUID, action: str, back: str, errors: dict[str, str]
) -> HttpResponse:
    """A Complete or Fail refused: nothing is done; the page's message names each field and
    what is wrong with it, and the form comes back with what was typed and each error beside
    its field (``_kept_typing``)."""
    what = "Not completed" if action == "complete" else "Not failed"
    problems = "; ".join(f"{field}: {error}" for field, error in errors.items())
    messages.error(request, f"{what}: {problems}. Nothing was changed.")
    _keep_refused(
        request,
        TODO_REFUSED,
        str(todo_id),
        action=action,
        typed={f: request.POST.get(f, "")[:KEPT_TEXT] for f in TYPED[action]},
        errors={f: e for f, e in errors.items() if f in TYPED[action]},
    )
    return HttpResponseRedirect(back)


def _form_errors(form: forms.Form) -> dict[str, str]:
    return {field: " ".join(str(e) for e in errs) for field, errs in form.errors.items()}


def _kept_typing(request: HttpRequest, todo_id: UUID) -> dict[str, Any]:
    """What a refused Complete or Fail of this todo left for its page, shown once: per action,
    the text typed per field and the errors beside them."""
    refused = _refused_for(request, TODO_REFUSED, str(todo_id))
    return {} if refused is None else {str(refused.get("action")): refused}


def _actions_for(state: str, dead_letter: bool) -> list[str]:
    if state == TodoState.PENDING:
        return ["claim", "discard"]
    if state == TodoState.CLAIMED:
        return ["complete", "fail", "release"]
    if state == TodoState.FAILED:
        return ["retry", "discard"]
    return []


@require_safe
@console_login_required
def todo_view(request: HtmxHttpRequest, todo_id: UUID) -> HttpResponse:
    viewer = Viewer.of(request)
    try:
        context = _todo_context(request, viewer, todo_id)
    except DomainError as exc:
        return refusal(request, exc)
    if request.htmx and request.htmx.target == "drawer":
        context["in_drawer"] = True
        return render(request, "queues/todo.html#drawer", context)
    return render(request, "queues/todo.html", context)


@require_POST
@console_login_required
@refuse_auditors
def todo_action_view(request: HttpRequest, todo_id: UUID, action: str) -> HttpResponse:
    viewer = Viewer.of(request)
    actor = viewer.actor
    back = safe_next(request, reverse("todo", args=[todo_id]))
    try:
        if action == "claim":
            claimed = services.claim(actor=actor, todo_id=todo_id)
            messages.success(
                request, f"Claimed “{isolated(claimed.todo.title)}” (attempt {claimed.attempt})."
            )
        elif action == "complete":
            form = TodoCompleteForm(request.POST)
            if not form.is_valid():
                # A result the edge refuses (NaN, too deep, a lone surrogate) was dropped and the
                # todo completed without it: nothing is done, and the message names the field.
                return _not_done(request, todo_id, action, back, _form_errors(form))
            data = form.cleaned_data
            services.complete(
                actor=actor,
                todo_id=todo_id,
                result=data.get("result"),
                summary=data.get("summary", ""),
                attempt=_shown_attempt(request),
            )
            messages.success(request, "Completed.")
        elif action == "fail":
            fail_form = TodoFailForm(request.POST)
            if not fail_form.is_valid():
                return _not_done(request, todo_id, action, back, _form_errors(fail_form))
            fdata = fail_form.cleaned_data
            todo = services.fail(
                actor=actor,
                todo_id=todo_id,
                error=fdata.get("error") or None,
                summary=fdata.get("summary", ""),
                attempt=_shown_attempt(request),
            )
            messages.success(
                request,
                "Failed: dead-lettered." if todo.dead_letter else "Failed: retry scheduled.",
            )
        elif action == "release":
            released = services.todo_release(
                actor=actor, todo_id=todo_id, attempt=_shown_attempt(request)
            )
            messages.success(
                request,
                "Released: it was its last attempt, so it is a dead letter now."
                if released.dead_letter
                else "Released: back to pending.",
            )
        elif action == "retry":
            services.todo_retry(actor=actor, todo_id=todo_id)
            messages.success(request, "Retried: back to pending with a fresh round of attempts.")
        elif action == "discard":
            services.todo_discard(
                actor=actor, todo_id=todo_id, seen_state=request.POST.get("seen_state") or None
            )
            messages.success(request, "Discarded: no claim or retry will take it again.")
        else:
            return refusal(request, NotFound(f"no todo action {action!r}"))
    except (Forbidden, NotFound) as exc:
        return refusal(request, exc)
    except InvalidArgument as exc:
        typed = exc.field.split(".", 1)[0]  # result.a: the result's field
        if typed in TYPED.get(action, ()):  # what was typed: kept, as when the form refuses it
            return _not_done(request, todo_id, action, back, {typed: exc.message})
        messages.error(request, _in_zone(exc, viewer))
    except DomainError as exc:
        messages.error(request, _in_zone(exc, viewer))
    return HttpResponseRedirect(back)


def _shown_attempt(request: HttpRequest) -> int:
    """The attempt the page showed in flight, which a complete, fail or release ends and no
    other: the agent may have released it and claimed again since the page loaded, and the
    operator's action would have ended that newer claim. Required."""
    raw = request.POST.get("attempt", "")
    if not raw:
        # Every form of the page says it; one that does not (a page from before the field, a
        # script) would end whichever claim is current, one the operator never saw.
        raise InvalidArgument(
            "attempt: the form did not say which attempt it ends; load the page again and "
            "send it from there",
            field="attempt",
        )
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 9) or int(raw) < 1:
        raise InvalidArgument(f"attempt: {raw!r} is not an attempt number", field="attempt")
    return int(raw)


# The instants a refusal's details may carry (written for machines: ISO 8601, UTC) that its
# message repeats; only an eligibility may be an estimate.
_INSTANTS = ("next_eligible_at", "lease_expires_at", "next_retry_at")


def _in_zone(exc: DomainError, viewer: Viewer) -> str:
    """A refusal's message as the page says times: each instant of its details the message
    names (``_INSTANTS``) in the viewer's zone, "≈" before an eligibility that is an estimate.
    A claim refused because someone holds the todo said "its lease until
    2026-12-05T22:41:07.512806Z"."""
    message = exc.message
    for key in _INSTANTS:
        at = exc.details.get(key)
        if not isinstance(at, str) or at not in message:
            continue
        when = datetime.fromisoformat(at.replace("Z", "+00:00"))
        estimate = key == "next_eligible_at" and not exc.details.get("exact")
        message = message.replace(at, ("≈ " if estimate else "") + at_zone(when, viewer.tz))
    return message


# --- bulk retry and discard of the board's selection ---------------------------------------------

BULK_WORDS = {
    "retry": (
        "Retry",
        "retried",
        "failed todos (waiting or dead) go back to pending, with a fresh round of attempts",
    ),
    "discard": ("Discard", "discarded", "pending and failed todos are discarded for good"),
}


def _selection(viewer: Viewer, filters: Filters) -> selectors.Selection:
    """The board's filtered selection. A condition filter narrows it to the identities the board
    shows under that condition now (worked out again when the action is confirmed)."""
    identities = None
    if filters.condition:
        shown = board.board_view(viewer, filters, cards=False).sections
        identities = frozenset((s.endpoint.id, s.queue) for s in shown)
    return selectors.Selection(
        endpoint=filters.endpoint,
        queue=filters.queue,
        state=filters.state,
        q=filters.q,
        identities=identities,
    )


def _bulk_page(
    request: HttpRequest,
    viewer: Viewer,
    action: str,
    filters: Filters,
    *,
    stale: bool = False,
    status: int = 200,
) -> HttpResponse:
    preview = selectors.bulk_preview(
        actor=viewer.actor, action=action, selection=_selection(viewer, filters)
    )
    verb, done, rule = BULK_WORDS[action]
    board_url = reverse("board") + (f"?{filters.query()}" if filters.query() else "")
    context = {
        "viewer": viewer,
        "action": action,
        "verb": verb,
        "done": done,
        "rule": rule,
        "preview": preview,
        "filters": filters,
        "board_url": board_url,
        "stale": stale,
        "nav": "board",
    }
    return render(request, "queues/bulk.html", context, status=409 if stale else status)


@require_http_methods(["GET", "HEAD", "POST"])
@console_login_required
@refuse_auditors
def bulk_view(request: HttpRequest, action: str) -> HttpResponse:
    """GET: what the action would change (count and sample), and a form to confirm exactly that.
    POST: the confirmed action; a selection that moved since is shown again, unchanged (409)."""
    if action not in BULK_WORDS:
        return refusal(request, NotFound(f"no bulk action {action!r}"))
    viewer = Viewer.of(request)
    try:
        filters = Filters.from_query(request.POST if request.method == "POST" else request.GET)
    except InvalidArgument as exc:  # never a wider selection than the one asked for
        return refusal(request, exc)
    if request.method != "POST":  # GET or HEAD: the page, never the action
        return _bulk_page(request, viewer, action, filters)
    try:
        result = services.todos_bulk(
            actor=viewer.actor,
            action=action,
            selection=_selection(viewer, filters),
            token=request.POST.get("selection", ""),
        )
    except Forbidden as exc:
        return refusal(request, exc)
    except DomainError as exc:
        if exc.details.get("reason") == "stale_selection":
            return _bulk_page(request, viewer, action, filters, stale=True)
        messages.error(request, exc.message)
        return _bulk_page(request, viewer, action, filters, status=exc.status)
    done = BULK_WORDS[action][1]
    plural = "" if result.count == 1 else "s"
    if result.applied_at is not None:  # this confirmation again (a double submit): done before
        when = stamp(result.applied_at, viewer.tz)
        messages.info(
            request,
            f"Already {done}: your confirmation {done} these {result.count} todo{plural} at "
            f"{when}. Nothing more was changed.",
        )
    else:
        messages.success(request, f"{done.capitalize()} {result.count} todo{plural}.")
    return HttpResponseRedirect(
        reverse("board") + (f"?{filters.query()}" if filters.query() else "")
    )


# --- throughput and agents ----------------------------------------------------------------------


@require_safe
@console_login_required
def occupancy_view(request: HttpRequest) -> HttpResponse:
    """Claims held per pool and per tag, per minute over the last 24 h (fleet-wide limits, so
    every operator sees every one), one chart each with its limit as a gridline."""
    viewer = Viewer.of(request)
    histories = activity.occupancy_history(limit_selectors.declared_occupancy_limits())
    return render(
        request,
        "queues/occupancy.html",
        {
            "viewer": viewer,
            "charts": [charts.occupancy_chart(h, viewer.tz) for h in histories],
            "nav": "occupancy",
        },
    )


@require_safe
@console_login_required
def throughput_view(request: HttpRequest) -> HttpResponse:
    """Claims, completions and failures per minute over the last hour, one chart per queue."""
    viewer = Viewer.of(request)
    ids = visible_endpoints(viewer.actor).values_list("id", flat=True)
    data = activity.throughput(list(ids))
    return render(
        request,
        "queues/throughput.html",
        {
            "viewer": viewer,
            "charts": [charts.throughput_chart(q, viewer.tz) for q in data],
            "window": activity.WINDOW_MINUTES,
            "nav": "throughput",
        },
    )


@require_safe
@console_login_required
def agents_view(request: HttpRequest) -> HttpResponse:
    """Each endpoint: when it was last seen and what it holds now."""
    viewer = Viewer.of(request)
    return render(
        request,
        "queues/agents.html",
        {
            "viewer": viewer,
            "agents": activity.agents(visible_endpoints(viewer.actor)),
            "shown": activity.HELD_SHOWN,
            "nav": "agents",
        },
    )


# --- the viewer's time zone ---------------------------------------------------------------------


@require_http_methods(["GET", "HEAD", "POST"])
@console_login_required
def timezone_view(request: HttpRequest) -> HttpResponse:
    """The viewer's zone for every time on the console: a cookie (set by static/js/tz.js from
    the browser, or chosen here). Without either, times show in UTC."""
    viewer = Viewer.of(request)
    form = TimezoneForm(request.POST or None, initial={"tz": viewer.tz_name})
    if request.method == "POST" and form.is_valid():
        name = form.cleaned_data["tz"].strip()
        if zone_exists(name):
            response = HttpResponseRedirect(safe_next(request, reverse("board")))
            response.set_cookie(
                TZ_COOKIE, name, max_age=TZ_COOKIE_AGE, samesite="Lax", httponly=False
            )
            return response
        form.add_error("tz", not_a_zone(name))
    status = 400 if request.method == "POST" else 200
    return render(
        request,
        "queues/timezone.html",
        {"viewer": viewer, "form": form, "zones": zones(), "next": safe_next(request, "")},
        status=status,
    )
