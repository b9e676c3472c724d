"""``manage.py queue pause NAME --reason TEXT [--create]`` and ``manage.py queue resume NAME``.

Both take ``--json`` and ``--as USER`` (the acting human; by default the only superuser, when
exactly one exists). Exit codes: 0 ok, 1 refused, 2 usage (switchboard/cli.py).
"""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import BaseCommand

from queues import pauses
from queues.access import HumanActor
from switchboard.core.cli import acting_human, add_common_options, emit, refused
from switchboard.core.errors import DomainError
from switchboard.core.times import iso


def register(subparsers: Any, parser: argparse.ArgumentParser) -> None:
    pause = subparsers.add_parser(
        "pause",
        help="stop handing out a queue's todos, fleet-wide (intake continues)",
        description="Pause a queue by name: no todo on it is claimed until it is resumed.",
    )
    pause.add_argument("queue", metavar="NAME", help="the queue name")
    pause.add_argument("--reason", required=True, help="why (shown on every read surface)")
    pause.add_argument(
        "--create", action="store_true", help="pause a name nothing has used yet (not a typo)"
    )
    add_common_options(pause)
    pause.set_defaults(handler=handle_pause)

    resume = subparsers.add_parser(
        "resume",
        help="lift a queue's pause and ring its consumers once",
        description="Resume a paused queue; resuming a live queue changes nothing. A name "
        "nothing has used is not found, as pause says of it.",
    )
    resume.add_argument("queue", metavar="NAME", help="the queue name")
    add_common_options(resume)
    resume.set_defaults(handler=handle_resume)


def handle_pause(command: BaseCommand, options: dict[str, Any]) -> None:
    actor = HumanActor(acting_human(options.get("as_user")), via="cli")
    try:
        result = pauses.queue_pause(
            actor=actor,
            queue=options["queue"],
            reason=options["reason"],
            create=bool(options.get("create")),
        )
    except DomainError as exc:
        refused(command, options, exc)
        return
    p = result.pause
    if result.changed:
        text = f"paused {result.queue}: {p.reason} (by {p.by} at {iso(p.at)})"
    else:
        text = (
            f"{result.queue} was already paused: {p.reason} (by {p.by} at {iso(p.at)}); "
            "nothing changed"
        )
    emit(command, options, result.as_dict(), text)


def handle_resume(command: BaseCommand, options: dict[str, Any]) -> None:
    actor = HumanActor(acting_human(options.get("as_user")), via="cli")
    try:
        result = pauses.queue_resume(
            actor=actor, queue=options["queue"], known=bool(options.get("known"))
        )
    except DomainError as exc:
        refused(command, options, exc)
        return
    if result.lifted is None:
        text = f"{result.queue} was not paused; nothing was lifted"
    else:
        text = (
            f"resumed {result.queue} (paused by {result.lifted.by}: {result.lifted.reason}); "
            + resume_outcome(result)
        )
    emit(command, options, result.as_dict(), text)


def resume_outcome(result: pauses.ResumeResult) -> str:
    """What a resume handed out, in words: who was rung, and who still waits on a budget or a
    named limit (nothing of theirs is handed out until it frees)."""
    parts = []
    if result.woken:
        parts.append("rang: " + ", ".join(result.woken))
    if result.held:
        parts.append(
            "still held by a budget or a named limit (rung when it frees): "
            + ", ".join(result.held)
        )
    return "; ".join(parts) if parts else "no endpoint has pending todos"
