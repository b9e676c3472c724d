"""Helpers shared by the management commands: --json output and the exit codes.

Exit codes: 0 ok, 1 refused (a DomainError; the message on stderr names the field), 2 usage.
"""

from __future__ import annotations

import json
import sys
from datetime import datetime
from typing import Any
from uuid import UUID

from django.core.management.base import BaseCommand, CommandError

from switchboard.errors import DomainError

EXIT_OK, EXIT_REFUSED, EXIT_USAGE = 0, 1, 2


def _default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, UUID):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def dumps(data: Any) -> str:
    return json.dumps(data, default=_default, indent=2, sort_keys=True)


def emit(command: BaseCommand, options: dict[str, Any], data: Any, text: str) -> None:
    """Print JSON with --json, else the human text."""
    command.stdout.write(dumps(data) if options.get("json") else text)


def refused(command: BaseCommand, options: dict[str, Any], exc: DomainError) -> None:
    """Report a refusal on stderr (JSON error object with --json) and exit 1."""
    if options.get("json"):
        command.stderr.write(dumps(exc.as_dict()))
    else:
        field = exc.details.get("field")
        command.stderr.write(f"refused ({exc.code}{', ' + field if field else ''}): {exc.message}")
    raise CommandError(exc.message, returncode=EXIT_REFUSED)


def usage(message: str) -> CommandError:
    return CommandError(message, returncode=EXIT_USAGE)


def exit_with(code: int) -> None:
    sys.exit(code)
