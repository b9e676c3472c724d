"""``manage.py queue budget show|set|clear``: budgets from the command line.

    queue budget show  [ENDPOINT] [QUEUE]
    queue budget set   ENDPOINT QUEUE [--per-hour N | --per-day N | --per-week N]
                       [--tz ZONE] [--start HH:MM] [--weekday Mon] [--max-in-flight N]
                       [--posture enforce|advise|off]
    queue budget clear ENDPOINT QUEUE

Each takes ``--json`` and ``--as USER`` (the acting human; by default the only superuser, when
exactly one exists). ``set`` is a full replace: a limit not given is removed. A window limit's
zone defaults to UTC and its start to 00:00. Exit codes: 0 ok, 1 refused (the message names the
field), 2 usage (switchboard/core/cli.py).
"""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import BaseCommand

from admission import selectors, services
from admission.policy import DEFAULT_POSTURE
from queues.access import HumanActor
from queues.models import Endpoint
from switchboard.core import versions
from switchboard.core.cli import (
    acting_human,
    add_common_options,
    emit,
    integer,
    refused,
    usage,
    version_argument,
)
from switchboard.core.errors import DomainError, NotFound
from switchboard.core.times import iso

PER_FLAGS = (("per_hour", "hour"), ("per_day", "day"), ("per_week", "week"))


def register(subparsers: Any, parser: argparse.ArgumentParser) -> None:
    budget = subparsers.add_parser(
        "budget",
        help="show, set or clear a queue's admission budget",
        description="Admission budgets: per queue of an endpoint, a cap on claims in flight "
        "and on claims per declared window.",
    )
    sub = budget.add_subparsers(dest="budget_command", title="budget commands")
    budget.set_defaults(handler=_needs_subcommand)

    show = sub.add_parser("show", help="list budgets with their status and usage")
    show.add_argument("endpoint", nargs="?", metavar="ENDPOINT", help="an endpoint slug or id")
    show.add_argument("queue", nargs="?", metavar="QUEUE", help="one queue of it")
    add_common_options(show)
    show.set_defaults(handler=handle_show)

    set_ = sub.add_parser(
        "set",
        help="set a queue's budget (a full replace)",
        description="Set the whole budget of ENDPOINT's QUEUE: a limit not given is removed.",
    )
    set_.add_argument("endpoint", metavar="ENDPOINT", help="an endpoint slug or id")
    set_.add_argument("queue", metavar="QUEUE")
    per = set_.add_mutually_exclusive_group()
    per.add_argument("--per-hour", type=integer, metavar="N", help="at most N claims per hour")
    per.add_argument("--per-day", type=integer, metavar="N", help="at most N claims per day")
    per.add_argument("--per-week", type=integer, metavar="N", help="at most N claims per week")
    set_.add_argument("--tz", metavar="ZONE", help="the window's IANA zone (default UTC)")
    set_.add_argument(
        "--start", metavar="HH:MM", help="local boundary time (default 00:00; hour: minutes only)"
    )
    set_.add_argument("--weekday", metavar="DAY", help="Mon..Sun, for --per-week (required)")
    set_.add_argument(
        "--window",
        action="append",
        metavar="N/PERIOD[@ZONE[@HH:MM[@DAY]]]",
        help="a stacked window limit, repeatable: --window 100/hour@Europe/Berlin "
        "--window 1000/day@Europe/Berlin --window 5000/week@UTC@00:00@Mon "
        "(instead of --per-hour/--per-day/--per-week)",
    )
    set_.add_argument(
        "--max-in-flight", type=integer, metavar="N", help="at most N claimed at once"
    )
    set_.add_argument(
        "--posture",
        metavar="P",
        default=DEFAULT_POSTURE,
        help="enforce (default), advise (admit over limit with a ledger waiver) or off",
    )
    _if_version(set_, "none: only where there is no budget yet")
    add_common_options(set_)
    set_.set_defaults(handler=handle_set)

    clear = sub.add_parser("clear", help="remove a queue's budget")
    clear.add_argument("endpoint", metavar="ENDPOINT", help="an endpoint slug or id")
    clear.add_argument("queue", metavar="QUEUE")
    _if_version(clear, "none: only where there is no budget (nothing to clear: exit 1)")
    add_common_options(clear)
    clear.set_defaults(handler=handle_clear)


def _if_version(parser: argparse.ArgumentParser, more: str) -> None:
    parser.add_argument(
        "--if-version",
        metavar="V",
        type=version_argument("queue budget show --json"),
        help="write only over this version of the budget (its `version`, as show --json prints "
        "it); if the budget is not as read, nothing is written (exit 1, precondition_failed)"
        + (f"; {more}" if more else ""),
    )


def _expected(options: dict[str, Any]) -> tuple[str, ...] | None:
    """``--if-version``'s condition for the service: none, a version, or "none" (no budget)."""
    return versions.named(options.get("if_version"))


def _needs_subcommand(command: BaseCommand, options: dict[str, Any]) -> None:
    raise usage("name a budget command: queue budget show|set|clear")


def _window(options: dict[str, Any]) -> tuple[int | None, dict[str, Any] | None]:
    given = [(flag, period) for flag, period in PER_FLAGS if options.get(flag) is not None]
    if not given:
        for flag in ("tz", "start", "weekday"):
            if options.get(flag) is not None:
                raise usage(
                    f"--{flag} describes a window: give --per-hour, --per-day or --per-week"
                )
        return None, None
    flag, period = given[0]
    if options.get("tz") == "":  # the API refuses "tz": "" too; UTC is said by leaving it out
        raise usage("--tz: name a zone (it is empty; leave --tz out for UTC)")
    if options.get("start") == "":  # as an empty HH:MM in --window: a mistake, never 00:00
        raise usage("--start: write HH:MM (it is empty; leave --start out for 00:00)")
    if options.get("weekday") == "":
        raise usage("--weekday: name a day, Mon to Sun (it is empty)")
    window: dict[str, Any] = {"period": period, "tz": options.get("tz") or "UTC"}
    if options.get("start") is not None:
        window["start"] = options["start"]
    if options.get("weekday") is not None:
        window["weekday"] = options["weekday"]
    return options[flag], window


def _windows(options: dict[str, Any]) -> list[dict[str, Any]] | None:
    """``--window N/PERIOD[@ZONE[@HH:MM[@DAY]]]`` flags as the ``windows`` list."""
    given = options.get("window")
    if not given:
        return None
    if any(options.get(flag) is not None for flag, _ in PER_FLAGS) or any(
        options.get(flag) is not None for flag in ("tz", "start", "weekday")
    ):
        raise usage("--window replaces --per-*, --tz, --start and --weekday: give one or the other")
    out = []
    for text in given:
        head, *parts = text.split("@")
        limit, slash, period = head.partition("/")
        limit, period = limit.strip(), period.strip()
        problem = None if not slash or len(parts) > 3 else _empty_window_part(limit, period, parts)
        if problem:
            raise usage(f"--window {text!r}: {problem}")
        # Digits 0-9 only: '²' passes isdigit() and int() refuses it; int() reads '١٠' as 10.
        if not slash or not (limit.isascii() and limit.isdigit()) or len(parts) > 3:
            raise usage(
                f"--window {text!r}: write N/PERIOD[@ZONE[@HH:MM[@DAY]]] with N in digits 0-9, "
                "e.g. 100/hour@UTC"
            )
        zone, start, weekday = (*parts, "", "", "")[:3]
        item: dict[str, Any] = {"limit": int(limit), "period": period, "tz": zone or "UTC"}
        if start:
            item["start"] = start
        if weekday:
            item["weekday"] = weekday
        out.append(item)
    return out


def _empty_window_part(limit: str, period: str, parts: list[str]) -> str | None:
    """What is wrong with the first empty part of ``--window N/PERIOD[@ZONE[@HH:MM[@DAY]]]``
    (``parts``: what follows each '@'), named as the syntax names it; None when none is empty.
    An empty part is a mistake, never its default ("5/hour@" is not "5/hour"): a default is
    asked for by leaving the part out with its '@', which only the last part can be."""
    if not limit:
        return "N, the claims per window, is empty: write it before '/', e.g. 100/hour"
    if not period:
        return "PERIOD is empty: write hour, day or week after '/', e.g. 100/hour"
    for at, part in enumerate(parts):
        if part.strip():
            continue
        last = at == len(parts) - 1
        if at == 0:
            fix = "leave it out with its '@' for UTC" if last else "name it (e.g. UTC) before HH:MM"
            return f"ZONE is empty: {fix}"
        if at == 1:
            fix = "leave it out with its '@' for 00:00" if last else "write it before DAY"
            return f"HH:MM, the start time, is empty: {fix}"
        if period == "week":
            return "DAY, the weekday a week starts on, is empty: write Mon, Tue, ... or Sun"
        return "DAY is empty: only a week window takes a weekday; leave it out with its '@'"
    return None


def handle_show(command: BaseCommand, options: dict[str, Any]) -> None:
    actor = HumanActor(acting_human(options.get("as_user")), via="cli")
    try:
        endpoint = None
        if options.get("endpoint") is not None:  # "" names no endpoint: not found, not "all"
            endpoint = _endpoint(actor, options["endpoint"])
        rows = selectors.policies_with_status(actor, endpoint=endpoint, queue=options.get("queue"))
        if options.get("queue") and not rows:
            assert endpoint is not None
            selectors.policy_get(actor, endpoint, options["queue"])  # raises not_found
    except DomainError as exc:
        refused(command, options, exc)
        return
    text = "\n".join(_line(r) for r in rows) if rows else "no budgets"
    emit(command, options, {"policies": rows}, text)


def _endpoint(actor: HumanActor, ref: str) -> Endpoint:
    """The ENDPOINT a read names; not found names the argument and the value, as ``todo push``
    does."""
    try:
        return selectors.endpoint_for(actor, ref, write=False)
    except NotFound as exc:
        raise NotFound(
            f"no endpoint with slug or id {ref!r}", field="endpoint", **exc.details
        ) from None


def handle_set(command: BaseCommand, options: dict[str, Any]) -> None:
    # The windows first: a usage error in them is said before anything (--as too) is looked up.
    stacked = _windows(options)
    per_window, window = _window(options) if stacked is None else (None, None)
    actor = HumanActor(acting_human(options.get("as_user")), via="cli")
    try:
        policy = services.policy_set(
            actor=actor,
            endpoint=options["endpoint"],
            queue=options["queue"],
            max_in_flight=options.get("max_in_flight"),
            max_claims_per_window=per_window,
            window=window,
            posture=options.get("posture"),
            windows=stacked,
            expected=_expected(options),
        )
    except DomainError as exc:
        refused(command, options, exc)
        return
    row = selectors.policy_status_out(policy, selectors.evaluate_policy(policy))
    emit(command, options, row, "set " + _line(row))


def handle_clear(command: BaseCommand, options: dict[str, Any]) -> None:
    actor = HumanActor(acting_human(options.get("as_user")), via="cli")
    try:
        before = services.policy_clear(
            actor=actor,
            endpoint=options["endpoint"],
            queue=options["queue"],
            expected=_expected(options),
        )
    except DomainError as exc:
        refused(command, options, exc)
        return
    emit(
        command,
        options,
        {"cleared": True, "queue": options["queue"], "before": before},
        f"cleared the budget on {options['endpoint']}/{options['queue']}",
    )


def _line(row: dict[str, Any]) -> str:
    """One budget on one line: scope/queue, posture, limits and usage, status."""
    p, s, u = row["policy"], row["status"], row["usage"]
    parts = [f"{p['scope']}/{p['queue']}", f"[{p['posture']}]"]
    if p["max_claims_per_window"] is not None:
        window = p["window"] or {}
        used = "?" if u["used"] is None else u["used"]
        phrase = window.get("description") or f"per {window.get('period')} ({window.get('tz')})"
        resets = u["window_resets_at"]
        parts.append(
            f"{used}/{p['max_claims_per_window']} {phrase}"
            + (f", resets {iso(resets)}" if resets else "")
        )
    for w in u["windows"][1:]:
        parts.append(f"{w['used']}/{w['limit']} {w['description'] or w['period']}")
    if s.get("window"):
        parts.append(f"held by {s['window']['description'] or s['window']['period']}")
    if p["max_in_flight"] is not None:
        parts.append(f"in flight {u['in_flight']}/{p['max_in_flight']}")
    if s["state"] == "admitted":
        parts.append("admitted")
    else:
        when = s["next_eligible_at"]
        parts.append(
            f"deferred: {s['reason']}"
            + (f" until {iso(when)}{'' if s['exact'] else ' (estimate)'}" if when else "")
        )
    return "  ".join(parts)
