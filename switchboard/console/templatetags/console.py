"""Template filters for the console: times in a zone, readable JSON, reason words."""

from __future__ import annotations

import html
import json
import re
from datetime import UTC, date, datetime, tzinfo
from typing import Any
from urllib.parse import quote
from uuid import UUID

from django import template
from django.urls import get_script_prefix, reverse
from django.utils import timezone
from django.utils.http import urlencode
from django.utils.safestring import SafeString, mark_safe

from queues import conditions
from switchboard.console.board import REASON_TEXT

register = template.Library()


@register.filter
def at_zone(value: datetime | None, zone: tzinfo | None, today: date | None = None) -> str:
    """``00:00 PST``, with the day when it is not today in that zone (``Tue 3 Dec 00:00 PST``).
    ``today`` (that zone's date) saves reading the clock once per time on a page of cards."""
    if value is None:
        return ""
    zone = zone or UTC
    local = value.astimezone(zone)
    if today is None:
        today = timezone.now().astimezone(zone).date()
    text = local.strftime("%H:%M %Z")
    if local.date() != today:
        text = f"{local:%a} {local.day} {local:%b} {text}"
    return text


@register.filter
def day_time(value: datetime | None, zone: tzinfo | None) -> str:
    """Always with the day: ``Mon 30 Nov 00:00 CET``."""
    if value is None:
        return ""
    local = value.astimezone(zone or UTC)
    return f"{local:%a} {local.day} {local:%b %H:%M %Z}"


@register.filter
def stamp(value: datetime | None, zone: tzinfo | None) -> str:
    """A full timestamp in a zone: ``2026-12-01 14:03:09 PST``."""
    if value is None:
        return ""
    return value.astimezone(zone or UTC).strftime("%Y-%m-%d %H:%M:%S %Z")


# A UTC instant as the API writes one (switchboard.core.times.iso), inside a sentence.
_ISO_INSTANT = re.compile(r"\b\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:Z|\+00:00)")


@register.filter
def times_in_zone(text: str | None, zone: tzinfo | None) -> str:
    """A sentence written for machines (a gate's detail) with each UTC instant in it shown as
    ``stamp`` shows times, in the viewer's zone: the todo page said "paused … since
    2026-12-05T15:42:54.221536Z" a line below "since 2026-12-05 21:12:54 IST"."""
    if not text:
        return ""

    def local(found: re.Match[str]) -> str:
        when = datetime.fromisoformat(found.group(0).replace("Z", "+00:00"))
        return stamp(when, zone)

    return _ISO_INSTANT.sub(local, text)


@register.filter
def iso(value: datetime | None) -> str:
    return value.astimezone(UTC).isoformat() if value else ""


@register.filter
def pretty_json(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, default=str)


@register.filter
def words(value: str | None) -> str:
    """A stored word as prose: ``dead_lettered`` reads "dead lettered"."""
    return (value or "").replace("_", " ")


@register.filter
def state_word(todo: Any) -> str:
    """A todo's state in the words of ``queues.conditions.TodoWord`` ("dead letter", …)."""
    return conditions.todo_word(todo.state, todo.next_retry_at).label


@register.filter
def state_class(todo: Any) -> str:
    """The CSS class of a todo's state: a dead letter has its own."""
    return conditions.todo_word(todo.state, todo.next_retry_at).value.replace("_", "-")


# Keys under which an agent's error carries a stack trace: shown as code, lines kept.
TRACE_KEYS = ("traceback", "stack", "stacktrace", "stack_trace", "backtrace")


@register.filter
def error_parts(value: Any) -> dict[str, Any]:
    """An error as the todo page shows it: its stack trace (if a string field names one) as
    code with its lines, a plain string as text, and the rest as indented JSON."""
    trace = None
    rest = value
    if isinstance(value, dict):
        for key in TRACE_KEYS:
            if isinstance(value.get(key), str):
                trace = value[key]
                rest = {k: v for k, v in value.items() if k != key}
                break
    if isinstance(rest, str):
        return {"text": rest, "trace": trace, "json": None}
    shown = None if rest in ({}, None) else json.dumps(rest, indent=2, sort_keys=True, default=str)
    return {"text": None, "trace": trace, "json": shown}


@register.filter
def reason_text(reason: str | None) -> str:
    if not reason:
        return ""
    return REASON_TEXT.get(reason, reason.replace("_", " "))


@register.filter
def status_text(status: dict[str, Any] | None) -> str:
    """A budget's derived status ({state, reason}) in the words of ``queues.conditions``."""
    if not status:
        return ""
    if status.get("state") != "deferred":
        return "Admitted"
    return reason_text(status.get("reason"))


@register.filter
def status_tone(status: dict[str, Any] | None) -> str:
    condition = conditions.for_reason((status or {}).get("reason"))
    if not status or status.get("state") != "deferred" or condition is None:
        return "admitted"
    return conditions.TONE[condition]


@register.filter
def condition_tone(condition: conditions.Condition) -> str:
    return conditions.TONE[condition]


@register.filter
def get_item(mapping: dict[Any, Any] | None, key: Any) -> Any:
    return (mapping or {}).get(key)


@register.filter
def times(value: int | None, factor: float) -> float:
    """``max|times:0.8``: a fraction of a limit (the meters' "getting full" mark)."""
    return round((value or 0) * float(factor), 2)


_paths: dict[tuple[str, str], str] = {}
_NIL = UUID(int=0)


def _path(name: str) -> str:
    """``reverse(name)`` once per script prefix: the board asks for the same few paths a hundred
    times a render, and each ``reverse`` walks the resolver."""
    key = (get_script_prefix(), name)
    if key not in _paths:
        _paths[key] = reverse(name, args=[_NIL]) if name == "todo" else reverse(name)
    return _paths[key]


def _e(value: Any) -> str:
    """Django's ``escape`` without its lazy-string wrapper (the same output, a fifth the cost)."""
    return html.escape(str(value))


@register.simple_tag
def board_line(s: Any) -> SafeString:
    """A healthy section folded to one line. Written here rather than as template markup: a
    large board has a hundred of them, and the template engine's lookups were most of its time."""
    query = urlencode({"endpoint": s.endpoint.slug, "queue": s.queue})
    tone = _e(s.tone)
    return mark_safe(
        f'<li id="line-{_e(s.key)}" class="qline">\n'
        f'  <a href="{_e(_path("board"))}?{_e(query)}">{_e(s.queue)} <span class="muted">on</span> '
        f'<span class="endpoint">{_e(s.endpoint.slug)}</span></a>\n'
        f'  <span class="badge tone-{tone}" data-tone="{tone}">{_e(s.tone_label)}</span>\n'
        f'  <span class="muted nowrap">{s.counts.get("pending", 0):d} pending · '
        f"{s.counts.get('claimed', 0):d} claimed · {s.counts.get('done', 0):d} done</span>\n"
        "</li>"
    )


@register.simple_tag(takes_context=True)
def board_cards(context: Any, s: Any) -> SafeString:
    """A section's cards, each with "why waiting, until when". Written here for the reason of
    ``board_line``: a large board shows about a hundred cards, and as template markup they were
    half of its rendering time. Every value is escaped (``_e``)."""
    zone = context["viewer"].tz
    nxt = _e(quote(str(context.get("here", "")), safe="/"))
    nil, todo_path = str(_NIL), _path("todo")
    today = timezone.now().astimezone(zone or UTC).date()
    return mark_safe(
        "".join(
            _card(t, s, zone, today, _e(todo_path.replace(nil, str(t.id))), nxt) for t in s.cards
        )
    )


def _card(t: Any, s: Any, zone: tzinfo | None, today: date, url: str, nxt: str) -> str:
    # An agent's own words (kind, owner, title) are isolated (<bdi>): a bidi control in one
    # cannot reorder the text after it (an RLO in a title showed "· inbox on agent · PENDING"
    # as "GNIDNEP · tnega no xobni ·").
    meta = f"<bdi>{_e(t.kind)}</bdi> · " if t.kind else ""
    meta += f"attempt {t.attempt:d} of {t.max_attempts:d}"
    chip = ""
    if t.state == "claimed":
        until = _e(at_zone(t.lease_expires_at, zone, today))
        # A lease in the past has lapsed (the next claim or the reaper moves it on), as the
        # todo's page says; "lease until" a past time read as held.
        lease = f"lease lapsed at {until}" if t.lease_lapsed else f"lease until {until}"
        meta += f" · held by <bdi>{_e(t.owner)}</bdi> · {lease}"
    elif t.state == "failed" and t.next_retry_at:
        meta += f" · retry at {_e(at_zone(t.next_retry_at, zone, today))}"
    elif t.state == "pending":
        meta += f" · waiting since {_e(at_zone(t.created_at, zone, today))}"
        status = s.chips.get(t.id)
        if s.pause:
            chip = '<span class="chip tone-paused">paused · waits for resume</span>\n'
        elif status and status.get("state") == "deferred":
            words = status_text(status)
            if status.get("limits"):  # a named limit's hold: which (the head names them too)
                words += ": " + ", ".join(limit["name"] for limit in status["limits"])
            if status.get("next_eligible_at"):
                words += " · eligible " + ("" if status.get("exact") else "≈ ")
                words += at_zone(status["next_eligible_at"], zone, today)
            chip = f'<span class="chip tone-{_e(status_tone(status))}">{_e(words)}</span>\n'
        elif s.quarantine:
            chip = '<span class="chip tone-quarantine">quarantine · never delivered</span>\n'
    link = f"{url}?next={nxt}"
    word = conditions.todo_word(t.state, t.next_retry_at)
    return (
        f'<li class="card state-{_e(t.state)}">\n<div class="card-top">\n'
        f'<a class="card-title" href="{link}" hx-get="{link}" hx-target="#drawer" '
        f'hx-swap="innerHTML"><bdi>{_e(t.title)}</bdi></a>\n'
        f'<span class="state-label state-{_e(word.value.replace("_", "-"))}">{_e(word.label)}</span>\n'
        f'</div>\n<div class="card-meta muted">{meta}</div>\n{chip}</li>\n'
    )


@register.simple_tag
def queue_options(names: list[str], chosen: str) -> SafeString:
    """The board filter's queue choices (a hundred on a large fleet: one string, not a loop)."""
    return mark_safe(
        "".join(
            f'<option value="{_e(q)}"{" selected" if q == chosen else ""}>{_e(q)}</option>'
            for q in names
        )
    )


@register.simple_tag
def endpoint_options(endpoints: Any, chosen: str) -> SafeString:
    """The board filter's endpoint choices, a revoked one marked so."""
    return mark_safe(
        "".join(
            f'<option value="{_e(e.slug)}"{" selected" if e.slug == chosen else ""}>'
            f"{_e(e.slug)}{'' if e.state == 'active' else ' (revoked)'}</option>"
            for e in endpoints
        )
    )
