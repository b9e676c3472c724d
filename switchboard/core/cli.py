"""Helpers shared by the management commands: their base class, --json output, the exit codes
and the argument types.

Exit codes: 0 ok, 1 refused (a DomainError; the message on stderr names the field), 2 usage.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import re
from collections.abc import Callable
from datetime import datetime
from typing import Any
from uuid import UUID

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.core.management.base import BaseCommand, CommandError, CommandParser

from switchboard.core import availability, versions
from switchboard.core.errors import DomainError, Forbidden
from switchboard.core.times import iso
from switchboard.core.users import user_named
from switchboard.core.validation import text_problem

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


def version_argument(listing: str) -> Callable[[str], str]:
    """``--if-version``'s type: a version as ``listing`` (the command that prints it) prints
    it, or "none"; argparse refuses anything else naming the option (usage error, exit 2)."""

    def version(value: str) -> str:
        try:
            return versions.spelled(value)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{exc}; {listing} prints them") from None

    return version


def usage(message: str) -> CommandError:
    return CommandError(message, returncode=EXIT_USAGE)


# ASCII digits only: int() also reads other scripts' digits ('١٠' is 10), and str.isdigit()
# accepts superscripts ('²') that int() then refuses.
_INTEGER = re.compile(r"-?[0-9]+")
_NUMBER = re.compile(r"-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)")


def is_integer(text: str) -> bool:
    """Whether ``text`` is a whole number written in ASCII digits (and an optional minus)."""
    return _INTEGER.fullmatch(text) is not None


def integer(value: str) -> int:
    """An integer option's type (argparse names the option in its usage error, exit 2)."""
    if not is_integer(value):
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number in digits 0-9")
    return int(value)


def number(value: str) -> float:
    """A decimal option's type: digits 0-9 with an optional fraction; finite."""
    if _NUMBER.fullmatch(value) is None or not math.isfinite(float(value)):
        raise argparse.ArgumentTypeError(f"{value!r} is not a number in digits 0-9 (e.g. 2.5)")
    return float(value)


def argument_names(parser: argparse.ArgumentParser, options: dict[str, Any]) -> dict[str, str]:
    """Each destination of the parser and of the subcommands ``options`` chose, as the user
    types it: ``--as`` for ``as_user``, the metavar (``SLUG``) for a positional. (Two
    subcommands may give one destination different names: ``QUEUE`` and ``NAME``.)"""
    names: dict[str, str] = {}
    parsers = [parser]
    while parsers:
        for action in parsers.pop()._actions:
            if isinstance(action, argparse._SubParsersAction):
                chosen = action.choices.get(options.get(action.dest) or "")
                parsers.extend([chosen] if chosen is not None else action.choices.values())
            elif action.option_strings:
                names.setdefault(action.dest, max(action.option_strings, key=len))
            else:
                metavar = action.metavar
                names.setdefault(action.dest, metavar if isinstance(metavar, str) else action.dest)
    return names


def check_arguments(options: dict[str, Any], names: dict[str, str]) -> None:
    """A usage error naming the first argument that cannot be stored or looked up: a lone
    surrogate (invalid UTF-8 in argv arrives as one) or a NUL would otherwise reach PostgreSQL
    in a lookup and end in a traceback."""
    for dest, value in options.items():
        for item in value if isinstance(value, list | tuple) else (value,):
            problem = text_problem(item) if isinstance(item, str) else None
            if problem and "\x00" not in item:
                # Python hands a byte of argv that is not UTF-8 over as a lone surrogate: what
                # the person typed was that byte, not a surrogate.
                problem = "is not valid UTF-8 (check the terminal's or the script's encoding)"
            if problem:
                raise usage(f"{names.get(dest, dest)}: {problem}")


class SwitchboardCommand(BaseCommand):
    """The base of every Switchboard command. Before ``handle`` runs, every string argument is
    checked (:func:`check_arguments`); a refusal that escapes ``handle`` (the ``--as`` user's,
    say), or a dependency that did not answer (503 ``unavailable`` on the API), is reported as
    :func:`refused` reports one, never as a traceback."""

    _parser: CommandParser | None = None

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        self._parser = super().create_parser(prog_name, subcommand, **kwargs)
        return self._parser

    def execute(self, *args: Any, **options: Any) -> str | None:
        names = argument_names(self._parser, options) if self._parser is not None else {}
        check_arguments(options, names)
        if options.get("json"):
            # The pool's warnings while it retries a database that does not answer are text on
            # stderr, where --json promises the error object alone (without --json they stay:
            # they name the cause, "connection refused").
            logging.getLogger("psycopg.pool").setLevel(logging.ERROR)
        try:
            return super().execute(*args, **options)
        except DomainError as exc:
            refused(self, options, exc)
            return None
        except Exception as exc:
            # The database or Valkey not answering (down, a wrong DATABASE_URL): a refusal that
            # says which, not a hundred lines of pool internals (and JSON alone with --json).
            if not availability.is_outage(exc):
                raise
            refused(self, options, availability.outage(exc))
            return None


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
    """The user ``flag`` names; a usage error for an empty name or no such user (an empty
    ``--owner`` or ``--as`` is a mistake, never "everyone" or "the default")."""
    if not username:
        raise usage(f"{flag}: name a user (it is empty)")
    user = user_named(username)
    if user is None:
        raise usage(f"{flag}: no user named {username!r}")
    return user


def as_user(username: str) -> AbstractBaseUser:
    """The human ``--as`` names. A deactivated account cannot sign in, so it cannot act here
    either: a refusal (exit 1), or the ledger would name someone who can no longer act."""
    user = named_user(username, "--as")
    if not user.is_active:
        raise Forbidden(f"--as: the user {username!r} is deactivated", field="as")
    return user


def acting_human(username: str | None) -> AbstractBaseUser:
    """The --as user, or the only superuser; a usage error when neither settles it."""
    model = get_user_model()
    users = model._default_manager
    if username is not None:
        return as_user(username)
    supers = list(users.filter(is_superuser=True, is_active=True)[:2])
    if len(supers) != 1:
        raise usage("name the acting human with --as USER (there is not exactly one superuser)")
    return supers[0]
