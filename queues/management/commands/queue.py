"""``manage.py queue …``: budgets (``queue budget show|set|clear``, admission/cli.py) and pauses
(``queue pause|resume``, queues/cli_pause.py). Each module registers its own subcommands."""

from __future__ import annotations

import importlib
from typing import Any

from django.core.management.base import CommandParser

from switchboard.core.cli import SwitchboardCommand, usage

SUBCOMMAND_MODULES = ("queues.cli_pause", "admission.cli")


class Command(SwitchboardCommand):
    help = "Operate queues: budgets and pauses."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="subcommand", title="subcommands")
        for name in SUBCOMMAND_MODULES:
            try:
                module = importlib.import_module(name)
            except ModuleNotFoundError as exc:
                if exc.name != name:
                    raise
                continue
            # register(subparsers) adds parsers that set_defaults(handler=fn(command, options)).
            module.register(sub, parser)

    def handle(self, *args: Any, **options: Any) -> None:
        handler = options.get("handler")
        if handler is None:
            raise usage("name a subcommand: queue budget show|set|clear, queue pause|resume")
        handler(self, options)
