"""``manage.py limits``: declare, change, list and delete the fleet-wide named limits.

    limits list [--json]
    limits set pool NAME [--slots N] [--posture P]
    limits set tag NAME [--limit N] [--posture P]
    limits set rate NAME [--base-limit N] [--floor N] [--decay-window S] [--posture P]
    limits delete pool|tag|rate NAME

Writes take ``--as USER`` (the acting human; else the only superuser) and ``--json``. Exit codes:
0 ok, 1 refused (the field is named), 2 usage (switchboard/core/cli.py).
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from admission.limits import services
from queues.access import HumanActor
from switchboard.core.cli import acting_human, add_common_options, emit, refused, usage
from switchboard.core.errors import DomainError

_OPTIONS = {
    "slots": ("--slots", "pool: claims naming it at once (0 holds them all)"),
    "limit": ("--limit", "tag: claims naming it at once (0 holds them all)"),
    "base_limit": ("--base-limit", "rate: claims per minute with no 429 in the decay window"),
    "floor": ("--floor", "rate: the least claims per minute however many 429s"),
    "decay_window_seconds": ("--decay-window", "rate: seconds a 429 keeps the limit halved"),
    "decay_step": ("--decay-step", "rate: halvings per 429 in the window (default 1, 0: none)"),
}


def _line(limit: dict[str, Any]) -> str:
    numbers = ", ".join(
        f"{k}={v}" for k, v in limit.items() if k not in ("kind", "name", "posture")
    )
    return f"{limit['kind']} {limit['name']}: {numbers} ({limit['posture']})"


class Command(BaseCommand):
    help = "Declare, change, list and delete pools, tag limits and rate limits."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="subcommand", title="subcommands")
        listing = sub.add_parser("list", help="every declared limit")
        listing.add_argument("--json", action="store_true", help="print JSON")
        setting = sub.add_parser("set", help="declare a limit or change the fields given")
        deleting = sub.add_parser("delete", help="remove a limit no live todo names")
        for p in (setting, deleting):
            p.add_argument("kind", choices=sorted(services.KINDS))
            p.add_argument("name", metavar="NAME")
            add_common_options(p)
        for dest, (flag, text) in _OPTIONS.items():
            setting.add_argument(flag, dest=dest, type=int, help=text)
        setting.add_argument("--posture", choices=["enforce", "advise", "off"])

    def handle(self, *args: Any, **options: Any) -> None:
        subcommand = options.get("subcommand")
        if subcommand == "list":
            found = services.limits_list()
            emit(self, options, found, "\n".join(map(_line, found)) or "no limits declared")
            return
        if subcommand not in ("set", "delete"):
            raise usage("name a subcommand: limits list|set|delete")
        actor = HumanActor(acting_human(options.get("as_user")), via="cli")
        try:
            if subcommand == "set":
                given = {
                    k: options[k] for k in (*_OPTIONS, "posture") if options.get(k) is not None
                }
                limit = services.limit_set(
                    actor=actor, kind=options["kind"], name=options["name"], **given
                )
                emit(self, options, limit, f"set {_line(limit)}")
            else:
                limit = services.limit_delete(
                    actor=actor, kind=options["kind"], name=options["name"]
                )
                emit(self, options, limit, f"deleted {limit['kind']} {limit['name']}")
        except DomainError as exc:
            refused(self, options, exc)
