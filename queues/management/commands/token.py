"""``manage.py token create|revoke``: humans' personal access tokens (``sbh_…``) for the API.

    token create --user USER [--name NAME] [--as USER] [--json]   prints the token once
    token revoke PREFIX_OR_ID [--as USER] [--json]    by id, by the shown prefix, or the token

``--as USER`` acts as that human (only a superuser acts for someone else); without it the
system acts and the ledger row names ``system:cli``.

Exit codes: 0 ok, 1 refused (stderr names the field), 2 usage (switchboard/cli.py).
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandParser

from queues import access, services
from queues.access import HumanActor
from queues.management.commands.endpoint import cli_actor
from queues.models import HumanToken
from queues.schemas import iso
from switchboard.core import tokens
from switchboard.core.cli import SwitchboardCommand, add_as_option, emit, named_user, refused, usage
from switchboard.core.errors import Conflict, DomainError, NotFound


def token_out(row: HumanToken) -> dict[str, Any]:
    return {
        "id": row.pk,
        "user": row.user.get_username(),
        "name": row.name,
        "prefix": row.token_prefix,
        "created_at": iso(row.created_at),
        "revoked_at": iso(row.revoked_at),
    }


class Command(SwitchboardCommand):
    help = "Create and revoke personal access tokens (sbh_…) for the API."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="subcommand", title="subcommands")
        create = sub.add_parser("create", help="create a token and print it once")
        create.add_argument("--user", required=True, metavar="USER")
        create.add_argument("--name", default="cli", help="what the token is for")
        create.add_argument("--json", action="store_true", help="print JSON")
        add_as_option(create)
        create.set_defaults(handler=self.create)

        revoke = sub.add_parser("revoke", help="revoke a token")
        revoke.add_argument("token", metavar="PREFIX_OR_ID")
        revoke.add_argument("--json", action="store_true", help="print JSON")
        add_as_option(revoke)
        revoke.set_defaults(handler=self.revoke)

    def handle(self, *args: Any, **options: Any) -> None:
        handler = options.get("handler")
        if handler is None:
            raise usage("name a subcommand: token create|revoke")
        try:
            handler(options)
        except DomainError as exc:
            refused(self, options, exc)

    def create(self, options: dict[str, Any]) -> None:
        user: Any = named_user(options["user"], "--user")
        row, token = services.human_token_create(
            user=user, name=options["name"], actor=cli_actor(options)
        )
        data = {**token_out(row), "token": token}
        text = f"token for {user.get_username()}: {token}\n(shown once; use it as Authorization: Bearer …)"
        emit(self, options, data, text)

    def revoke(self, options: dict[str, Any]) -> None:
        given: str = options["token"].strip()
        actor = cli_actor(options)
        rows = HumanToken.objects.select_related("user")
        if isinstance(actor, HumanActor):
            # Only tokens the acting human may read: another's is not found, as on the API (a
            # forbidden answer would say that a token with that prefix exists).
            rows = rows.filter(access.token_q(actor))
        if given.isascii() and given.isdigit():  # an id: digits 0-9 ('²' passes isdigit)
            matches = list(rows.filter(pk=int(given)))
        elif given.startswith(tokens.HUMAN_TOKEN_PREFIX) and len(given) > 16:
            matches = list(rows.filter(token_hash=tokens.hash_token(given)))
        else:
            matches = list(rows.filter(token_prefix__startswith=given)[:2]) if given else []
        if not matches:
            raise NotFound(f"no token matches {given!r}", field="token")
        if len(matches) > 1:
            raise Conflict(f"{given!r} matches more than one token; give its id", field="token")
        row = matches[0]
        changed = services.human_token_revoke(token=row, actor=actor)
        row.refresh_from_db()
        text = f"revoked {row.token_prefix}… ({row.user.get_username()})"
        if not changed:
            text = f"{row.token_prefix}… was already revoked"
        emit(self, options, {**token_out(row), "changed": changed}, text)
