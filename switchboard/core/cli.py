"""Helpers shared by the management commands: --json output and the exit codes.

Exit codes: 0 ok, 1 refused (a DomainError; the message on stderr names the field), 2 usage.
"""

from __future__ import annotations

import argparse
import json
import re
from datetime import datetime
from typing import Any
from uuid import UUID

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.core.management.base import BaseCommand, CommandError

from switchboard.core import versions
from switchboard.core.errors import DomainError
from switchboard.core.times import iso
from switchboard.core.users import user_named

EXIT_OK, EXIT_REFUSED, EXIT_USAGE = 0, 1, 2


def _default(value: Any) -> Any:
    if isinstance(value, datetime):
        return iso(value)
    if isinstance(value, UUID):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def dumps(data: Any) -> str:
    return json.dumps(data, default=_default, indent=2, sort_keys=True)


# Control characters but the line break and the tab: C0, DEL and C1 (ESC starts a terminal's
# escape sequences, and C1's CSI is one byte of it).
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """Text for a terminal: control characters shown as ``\\xNN``. A title, an endpoint's name
    or a pause reason is someone else's text; written raw, an escape sequence in it would recolour,
    retitle or rewrite the operator's terminal. (``--json`` escapes them already.)"""
    return _CONTROLS.sub(lambda m: f"\\x{ord(m[0]):02x}", text)


def emit(command: BaseCommand, options: dict[str, Any], data: Any, text: str) -> None:
    """Print JSON with --json, else the human text."""
    command.stdout.write(dumps(data) if options.get("json") else printable(text))


def refused(command: BaseCommand, options: dict[str, Any], exc: DomainError) -> None:
    """Report a refusal on stderr (JSON error object with --json) and exit 1."""
    message = printable(exc.message)
    if options.get("json"):
        command.stderr.write(dumps(exc.as_dict()))
    else:
        field = exc.details.get("field")
        command.stderr.write(f"refused ({exc.code}{', ' + field if field else ''}): {message}")
    if getattr(command, "_called_from_command_line", False):
        # Django would write "CommandError: …" after it: the refusal twice in text, and no
        # longer JSON alone with --json. Exit with the refusal's code, said once.
        raise SystemExit(EXIT_REFUSED)
    raise CommandError(message, returncode=EXIT_REFUSED)


def version_argument(value: str) -> str:
    """``--if-version``'s type: a version as ``show --json`` prints it, or "none"; argparse
    refuses anything else naming the option (usage error, exit 2)."""
    try:
        return versions.spelled(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def usage(message: str) -> CommandError:
    return CommandError(message, returncode=EXIT_USAGE)


def add_common_options(parser: argparse.ArgumentParser) -> None:
    """--json and --as USER, on every operator subcommand that acts as a human."""
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument(
        "--as",
        dest="as_user",
        metavar="USER",
        help="the acting human (default: the only superuser, if there is exactly one)",
    )


def add_as_option(parser: argparse.ArgumentParser) -> None:
    """--as USER on a subcommand that acts as a human only when told to (without it, the system
    acts: the change passes no access check and lands in the ledger as ``system:cli``)."""
    parser.add_argument(
        "--as",
        dest="as_user",
        metavar="USER",
        help="the acting human (default: the system; the ledger records system:cli)",
    )


def named_user(username: str, flag: str) -> AbstractBaseUser:
    user = user_named(username)
    if user is None:
        raise usage(f"{flag}: no user named {username!r}")
    return user


def acting_human(username: str | None) -> AbstractBaseUser:
    """The --as user, or the only superuser; a usage error when neither settles it."""
    model = get_user_model()
    users = model._default_manager
    if username:
        return named_user(username, "--as")
    supers = list(users.filter(is_superuser=True, is_active=True)[:2])
    if len(supers) != 1:
        raise usage("name the acting human with --as USER (there is not exactly one superuser)")
    return supers[0]
