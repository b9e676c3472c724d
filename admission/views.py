"""The console pages of the admission app: the budget editor (with preview, history and clear)
and the ledger list with its CSV export and chain badge.

Writes go through ``admission.services.policy_set`` / ``policy_clear`` (so each lands in the
ledger); reads through ``admission.selectors``; the preview through ``admission.engine.evaluate``
and ``admission.windows``; the chain badge from the stored check
(``switchboard.ledger.chain.last_check``, refreshed by beat, ``ledger verify`` and "verify now").
"""

from __future__ import annotations

import csv
import hashlib
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from django.contrib import messages
from django.core.paginator import Paginator
from django.db.models import QuerySet
from django.http import (
    HttpRequest,
    HttpResponse,
    HttpResponseRedirect,
    QueryDict,
    StreamingHttpResponse,
)
from django.http.response import HttpResponseBase
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import (
    require_GET,
    require_http_methods,
    require_POST,
    require_safe,
)

from admission import engine, services
from admission import selectors as admission_selectors
from admission.forms import LedgerFilterForm, PolicyForm
from admission.models import PRIMARY_WINDOW_KEY, AdmissionPolicy
from admission.policy import PolicySpec
from queues.access import Viewer
from queues.models import Endpoint, check_queue_name
from switchboard.core import versions
from switchboard.core.errors import (
    DomainError,
    Forbidden,
    InvalidArgument,
    NotFound,
    PreconditionFailed,
    RateLimited,
)
from switchboard.core.pages import HtmxHttpRequest, console_login_required, identity_key, refusal
from switchboard.core.times import iso
from switchboard.core.zones import zone_named, zones
from switchboard.ledger.models import LedgerEntry, LedgerKind

LEDGER_PAGE = 50

# --- the budget editor --------------------------------------------------------------------------


def _board_anchor(endpoint: Endpoint, queue: str) -> str:
    """Back to the board, focus on the section's edit control (static/js/console.js)."""
    return reverse("board") + "#edit-" + identity_key(endpoint.slug, queue)


def _identity(request: HttpRequest, viewer: Viewer, slug: str, queue: str) -> Endpoint:
    check_queue_name(queue)
    return admission_selectors.endpoint_for(viewer.actor, slug, write=False)


def _policy(endpoint: Endpoint, queue: str) -> AdmissionPolicy | None:
    return (
        AdmissionPolicy.objects.select_related("endpoint", "updated_by")
        .filter(endpoint=endpoint, queue=queue)
        .first()
    )


def _preview_token(kwargs: dict[str, Any]) -> str:
    """Ties a save to the values the preview showed: changed values are previewed again."""
    return hashlib.sha256(json.dumps(kwargs, sort_keys=True).encode()).hexdigest()[:16]


def preview(
    endpoint: Endpoint, queue: str, policy: AdmissionPolicy | None, spec: PolicySpec
) -> dict[str, Any]:
    """What the change would do now: the proposed definition evaluated by the engine against the
    identity's current in-flight claims and window counters (the window under the new
    definition, and the counter the claim would read for it)."""
    now = timezone.now()
    current = admission_selectors.evaluate_policy(policy, now) if policy is not None else None
    row = engine.PolicyRow(
        id=policy.id if policy is not None else uuid.uuid4(),
        endpoint_id=endpoint.id,
        queue=queue,
        **spec.columns(),
    )
    # A save that redefines the first window moves its counters (services._follow_first_window):
    # the proposal reads the counts the save gives it.
    moved = services.counters_after_save(
        PolicySpec.of(policy) if policy is not None else None, spec
    )
    proposed = admission_selectors.evaluate_rows([row], now, counted_under={row.id: moved})[row.id]
    after = spec.audited(endpoint.id)
    before = admission_selectors.policy_dict(policy) if policy is not None else None
    new_count = (
        current is not None
        and current.window_start is not None
        and proposed.window_start is not None
        and (current.window_start != proposed.window_start or PRIMARY_WINDOW_KEY in moved)
    )
    return {
        "current": current,
        "current_usage": admission_selectors.usage(current) if current else None,
        "proposed": proposed,
        "status": admission_selectors.status(proposed),
        "usage": admission_selectors.usage(proposed),
        "changes": changes(before, after),
        "new_count": new_count,
        "zone": zone_named(spec.window.tz)[1] if spec.window and spec.window.tz else None,
    }


@require_http_methods(["GET", "HEAD", "POST"])
@console_login_required
def budget_view(request: HttpRequest, slug: str, queue: str) -> HttpResponse:
    viewer = Viewer.of(request)
    try:
        endpoint = _identity(request, viewer, slug, queue)
    except (NotFound, InvalidArgument) as exc:
        return refusal(request, NotFound(exc.message))
    policy = _policy(endpoint, queue)
    can_write = viewer.can_write_budget(endpoint, queue)
    context: dict[str, Any] = {}
    if request.method == "POST":
        if not can_write:
            return refusal(request, Forbidden("you may read this budget but not change it"))
        adding = request.POST.get("action") == "add_window"
        form = PolicyForm(request.POST, add_row=adding)
        if adding:
            pass  # the same values again, with a blank window row; nothing is checked yet
        elif not form.is_valid():
            form.check_every_field(queue)
        else:
            kwargs = form.service_kwargs()
            try:
                spec = PolicySpec.clean(queue=queue, **kwargs)
            except InvalidArgument as exc:
                form.add_domain_error(exc.field, exc.message)
                form.check_every_field(queue)
            else:
                token = _preview_token(kwargs)
                if request.POST.get("action") == "save" and request.POST.get("previewed") == token:
                    # The save applies the change the preview showed, or nothing: it writes only
                    # over the budget's version the preview compared with.
                    seen = request.POST.get("version", "")
                    try:
                        services.policy_set(
                            actor=viewer.actor,
                            endpoint=endpoint,
                            queue=queue,
                            expected=(seen,),
                            **kwargs,
                        )
                    except (Forbidden, NotFound) as exc:
                        return refusal(request, exc)
                    except InvalidArgument as exc:
                        form.add_domain_error(exc.field, exc.message)
                    except PreconditionFailed:
                        policy = _policy(endpoint, queue)
                        context["changed"] = _what_changed(seen, policy)
                        context |= _preview_context(endpoint, queue, policy, spec, token)
                    except DomainError as exc:
                        form.add_error(None, exc.message)
                    else:
                        messages.success(request, f"Budget saved for {queue} on {endpoint.slug}.")
                        return HttpResponseRedirect(_board_anchor(endpoint, queue))
                else:
                    context |= _preview_context(endpoint, queue, policy, spec, token)
    else:
        form = PolicyForm(
            initial=PolicyForm.initial_for(policy, viewer.tz_name),
            rows=PolicyForm.rows_for(policy),
        )
    status = 400 if form.has_errors else 409 if context.get("changed") else 200
    context = _budget_context(viewer, endpoint, queue, policy, form, can_write, context)
    return render(request, "admission/budget.html", context, status=status)


def _preview_context(
    endpoint: Endpoint, queue: str, policy: AdmissionPolicy | None, spec: PolicySpec, token: str
) -> dict[str, Any]:
    """The preview, its token and the version of the budget it compared with (the save's
    condition)."""
    return {
        "preview": preview(endpoint, queue, policy, spec),
        "previewed": token,
        "version": admission_selectors.policy_version(policy),
    }


def _what_changed(seen: str, policy: AdmissionPolicy | None) -> str:
    """How the budget moved since the preview the save came from: cleared, created, changed."""
    if policy is None:
        return "cleared"
    return "created" if seen == versions.ABSENT else "changed"


def _budget_context(
    viewer: Viewer,
    endpoint: Endpoint,
    queue: str,
    policy: AdmissionPolicy | None,
    form: PolicyForm,
    can_write: bool,
    extra: dict[str, Any],
) -> dict[str, Any]:
    evaluation = admission_selectors.evaluate_policy(policy) if policy is not None else None
    usage = admission_selectors.usage(evaluation) if evaluation else None
    return {
        "viewer": viewer,
        "endpoint": endpoint,
        "queue": queue,
        "policy": policy,
        "evaluation": evaluation,
        "status": admission_selectors.status(evaluation) if evaluation else None,
        "usage": usage,
        "window_description": admission_selectors.describe_window(policy) if policy else None,
        "policy_zone": zone_named(policy.window_tz)[1] if policy and policy.window_tz else None,
        "form": form,
        "can_write": can_write,
        "zones": zones(),
        "charts": usage_charts(policy, usage) if policy is not None else [],
        "audit": admission_selectors.audit_tail(policy, 10) if policy is not None else [],
        "board_anchor": _board_anchor(endpoint, queue),
        "key": identity_key(endpoint.slug, queue),
        "focus": _focus(form, preview=bool(extra.get("preview"))),
        **extra,
    }


def _focus(form: PolicyForm, *, preview: bool) -> str:
    """Where focus lands: the first field in error, else the first field (or, on a preview,
    the save button)."""
    if form.has_errors:
        return form.first_error() or "max_in_flight"
    if form.add_row:
        return form.rows.add_prefix(form.rows.total_form_count()) + "-limit"
    return "" if preview else "max_in_flight"


@require_http_methods(["GET", "HEAD", "POST"])
@console_login_required
def budget_clear_view(request: HttpRequest, slug: str, queue: str) -> HttpResponse:
    """Clearing asks first (GET: the confirmation page; POST: ``policy_clear``)."""
    viewer = Viewer.of(request)
    try:
        endpoint = _identity(request, viewer, slug, queue)
    except (NotFound, InvalidArgument) as exc:
        return refusal(request, NotFound(exc.message))
    if not viewer.can_write_budget(endpoint, queue):
        return refusal(request, Forbidden("you may read this budget but not change it"))
    policy = _policy(endpoint, queue)
    if policy is None:
        if request.method == "POST":  # a double click's second POST, or a clear by another
            return _already_cleared(request, endpoint, queue)
        return refusal(request, NotFound(f"no budget on endpoint:{endpoint.slug}/{queue}"))
    if request.method == "POST":
        try:
            services.policy_clear(
                actor=viewer.actor,
                endpoint=endpoint,
                queue=queue,
                expected=(request.POST.get("version", ""),),
            )
        except NotFound as exc:
            if _policy(endpoint, queue) is None:  # cleared while this one waited for it
                return _already_cleared(request, endpoint, queue)
            return refusal(request, exc)
        except Forbidden as exc:
            return refusal(request, exc)
        except PreconditionFailed:
            messages.error(
                request,
                "Not cleared: the budget changed after this page was opened. "
                "Here it is as it is now; clear it again if you still mean to.",
            )
            return HttpResponseRedirect(reverse("budget_clear", args=[endpoint.slug, queue]))
        except DomainError as exc:
            messages.error(request, exc.message)
            return HttpResponseRedirect(reverse("budget_clear", args=[endpoint.slug, queue]))
        messages.success(request, f"Budget cleared for {queue} on {endpoint.slug}.")
        return HttpResponseRedirect(_board_anchor(endpoint, queue))
    return render(
        request,
        "admission/clear.html",
        {
            "viewer": viewer,
            "endpoint": endpoint,
            "queue": queue,
            "policy": policy,
            "window_description": admission_selectors.describe_window(policy),
            "board_anchor": _board_anchor(endpoint, queue),
            "version": admission_selectors.policy_version(policy),
        },
    )


def _already_cleared(request: HttpRequest, endpoint: Endpoint, queue: str) -> HttpResponse:
    """A clear that finds no budget: the end it asked for holds (the ledger says who cleared it),
    so back to the board saying so, not a "not found" page after a double click."""
    messages.info(request, f"{queue} on {endpoint.slug} has no budget now: it is cleared.")
    return HttpResponseRedirect(_board_anchor(endpoint, queue))


# --- the usage chart ----------------------------------------------------------------------------


@dataclass
class Bar:
    x: float
    width: float
    used_y: float
    used_h: float
    refused_y: float
    refused_h: float
    limit_y: float | None
    label: str


def usage_charts(policy: AdmissionPolicy, usage: dict[str, Any] | None) -> list[dict[str, Any]]:
    """One chart per window limit of the policy (the first one first), each over that window's
    own counters, titled with its use now from the usage selector and marked when it binds.
    A policy whose windows cannot be evaluated now still charts the history it has."""
    windows = (usage or {}).get("windows") or []
    if not windows:
        history = admission_selectors.window_history(policy)
        return [{**usage_chart(history, policy.window_tz), "window": None, "number": 1}]
    return [
        {
            **usage_chart(admission_selectors.window_history(policy, key=w["key"]), w["tz"]),
            "window": w,
            "number": n,
        }
        for n, w in enumerate(windows, start=1)
    ]


def usage_chart(history: list[dict[str, Any]], tz_name: str | None) -> dict[str, Any]:
    """Geometry for the inline SVG of the last windows (oldest left): used, refused stacked on
    top, and the limit then in force as a tick per window."""
    width, height, left, bottom, top = 640.0, 180.0, 40.0, 24.0, 10.0
    plot_w, plot_h = width - left - 8, height - bottom - top
    rows = list(reversed(history))
    slots = max(len(rows), admission_selectors.HISTORY_WINDOWS)
    peak = max(
        [1]
        + [r["used"] + r["refused"] for r in rows]
        + [r["limit"] for r in rows if r["limit"] is not None]
    )
    zone = zone_named(tz_name)[1]
    step = plot_w / slots
    bar_w = max(step * 0.7, 1.0)

    def y(value: float) -> float:
        return top + plot_h - plot_h * value / peak

    bars = []
    for i, r in enumerate(rows):
        x = left + (slots - len(rows) + i) * step + (step - bar_w) / 2
        used_top = y(r["used"])
        refused_top = y(r["used"] + r["refused"])
        start = r["window_start"].astimezone(zone)
        limit_text = "no limit recorded" if r["limit"] is None else f"limit {r['limit']}"
        bars.append(
            Bar(
                x=round(x, 1),
                width=round(bar_w, 1),
                used_y=round(used_top, 1),
                used_h=round(top + plot_h - used_top, 1),
                refused_y=round(refused_top, 1),
                refused_h=round(used_top - refused_top, 1),
                limit_y=round(y(r["limit"]), 1) if r["limit"] is not None else None,
                label=f"{start:%a %d %b %H:%M}: {r['used']} used, {r['refused']} refused, "
                f"{limit_text}",
            )
        )
    first = rows[0]["window_start"].astimezone(zone) if rows else None
    last = rows[-1]["window_start"].astimezone(zone) if rows else None
    return {
        "width": int(width),
        "height": int(height),
        "left": left,
        "baseline": top + plot_h,
        "top": top,
        "right": width - 8,
        "peak": peak,
        "bars": bars,
        "first": f"{first:%d %b %H:%M}" if first else "",
        "last": f"{last:%d %b %H:%M}" if last and len(rows) > 1 else "",
        "label_y": height - 6,
        "empty": not rows,
        "refusals": sum(r["refused"] for r in rows),
        "tz": tz_name,
        "rows": history,
        "zone": zone,
    }


# --- the ledger ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Change:
    field: str
    before: str
    after: str


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, inner in value.items():
            out.update(_flat(inner, f"{prefix}{key}."))
        return out
    return {prefix.rstrip("."): value}


def _text(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, str):
        return value
    return json.dumps(value, default=str)


def changes(before: dict[str, Any] | None, after: dict[str, Any] | None) -> list[Change]:
    """A readable before/after diff: the fields that differ, nested keys dotted (window.tz)."""
    old = _flat(before or {})
    new = _flat(after or {})
    out = []
    for key in sorted(set(old) | set(new)):
        if key == "endpoint_id" or (old.get(key) == new.get(key) and before and after):
            continue
        if old.get(key) is None and new.get(key) is None:
            continue
        out.append(
            Change(key, _text(old.get(key)) if before else "", _text(new.get(key)) if after else "")
        )
    return out


def filtered_ledger(viewer: Viewer, form: LedgerFilterForm) -> QuerySet[LedgerEntry]:
    """The ledger rows the viewer may read, narrowed by a valid filter form (none otherwise)."""
    if not form.is_valid():
        return LedgerEntry.objects.none()
    data = form.cleaned_data
    return admission_selectors.ledger_rows(
        actor=viewer.actor,
        scope=data.get("scope") or None,
        queue=data.get("queue") or None,
        actor_name=data.get("actor") or None,
        kind=data.get("action") or None,
        since=data.get("since"),
        until=data.get("until"),
        tz=viewer.tz,
    )


@require_POST
@console_login_required
def ledger_verify_view(request: HttpRequest) -> HttpResponse:
    """Verify the chain now (it reads every row) and show the ledger with the fresh result. Each
    person may ask so often (``LEDGER_VERIFY_RATE_LIMIT``): a verify reads the whole ledger, so
    a button held down, or a script, would have the web process do nothing else."""
    try:
        services.ledger_verify_now(actor=Viewer.of(request).actor)
    except RateLimited as exc:
        messages.warning(
            request,
            "The chain was verified a moment ago (the badge shows it); verify again in "
            f"{exc.details['retry_after']} s.",
        )
    # Back to the rows the viewer was reading (the form carries the page's filter): its query
    # string re-encoded, so nothing but a query follows the page's own path.
    query = QueryDict(request.POST.get("query", "")).urlencode()
    return redirect(f"{reverse('ledger')}?{query}" if query else reverse("ledger"))


@require_safe
@console_login_required
def ledger_view(request: HtmxHttpRequest) -> HttpResponse:
    return _ledger_page(request, LedgerFilterForm(request.GET))


def _ledger_page(
    request: HtmxHttpRequest, form: LedgerFilterForm, status: int = 200
) -> HttpResponse:
    """The ledger page for ``form``'s filters: a filter it refuses is named above the rows."""
    viewer = Viewer.of(request)
    qs = filtered_ledger(viewer, form)
    page = Paginator(qs, LEDGER_PAGE).get_page(request.GET.get("page"))
    query = request.GET.copy()
    query.pop("page", None)
    rows = [(entry, changes(entry.before, entry.after)) for entry in page.object_list]
    context = {
        "viewer": viewer,
        "form": form,
        "page": page,
        "rows": rows,
        "query": query.urlencode(),
        "kinds": LedgerKind.choices,
        "badge": admission_selectors.chain_badge(viewer.actor),
        "nav": "ledger",
    }
    if request.htmx and request.htmx.target == "ledger-rows":
        return render(request, "admission/ledger.html#rows", context, status=status)
    return render(request, "admission/ledger.html", context, status=status)


CSV_COLUMNS = [
    "seq",
    "at",
    "action",
    "actor_human",
    "actor_endpoint",
    "scope",
    "queue",
    "changes",
    "before",
    "after",
    "entry_hash",
    # 0: declarations and decisions; 1-8: the grant chains (grant and end rows).
    "chain",
    "chain_pos",
]


class _Echo:
    def write(self, value: str) -> str:
        return value


# A cell a spreadsheet would read as a formula (OWASP "CSV injection"): shown as text instead.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value: object) -> object:
    """A value safe to open in a spreadsheet: text starting like a formula gets a leading
    apostrophe, which spreadsheets show as text and never evaluate."""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


def _csv_rows(qs: QuerySet[LedgerEntry]) -> Iterator[str]:
    writer = csv.writer(_Echo())
    yield writer.writerow(CSV_COLUMNS)
    for entry in qs.iterator(chunk_size=2000):
        diff = "; ".join(
            f"{c.field}: {c.before or '∅'} → {c.after or '∅'}"
            for c in changes(entry.before, entry.after)
        )
        yield writer.writerow(
            csv_cell(cell)
            for cell in [
                entry.seq,
                iso(entry.at),
                entry.kind,
                entry.actor_human_name,
                entry.actor_endpoint_slug,
                entry.scope,
                entry.queue,
                diff,
                json.dumps(entry.before, sort_keys=True) if entry.before is not None else "",
                json.dumps(entry.after, sort_keys=True) if entry.after is not None else "",
                entry.entry_hash,
                entry.chain,
                entry.chain_pos,
            ]
        )


@require_GET
@console_login_required
def ledger_csv_view(request: HtmxHttpRequest) -> HttpResponseBase:
    """The filtered rows as CSV (times in UTC, ISO 8601), newest first, streamed. A filter it
    refuses gives the ledger page (400) naming it, with no export offered: a browser that
    followed the link sees why, not a text file."""
    viewer = Viewer.of(request)
    form = LedgerFilterForm(request.GET)
    if not form.is_valid():
        return _ledger_page(request, form, status=400)
    qs = filtered_ledger(viewer, form)
    response = StreamingHttpResponse(_csv_rows(qs), content_type="text/csv; charset=utf-8")
    stamp = timezone.now().strftime("%Y%m%d-%H%M%S")
    response["Content-Disposition"] = f'attachment; filename="ledger-{stamp}.csv"'
    response["Cache-Control"] = "no-store"
    return response
