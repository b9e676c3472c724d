"""``manage.py endpoint vend|list|revoke|rotate-hook-secret``: agents' credentials, from the shell.

    endpoint vend --owner USER --name NAME --queues a,b [--verbs v,w] [--lease-ttl S] [--rps N]
                  [--burst N] [--slug SLUG] [--as USER] [--json]
    endpoint list [--owner USER] [--state active|revoked] [--json]
    endpoint revoke SLUG [--as USER] [--json]
    endpoint rotate-hook-secret SLUG [--overlap S] [--as USER] [--json]

``--as USER`` acts as that human (their access applies and the ledger names them); without it
the system acts and the ledger row names ``system:cli``.

``vend`` prints the slug, the token (shown once), the MCP URL and a ready ``.mcp.json`` snippet.
Exit codes: 0 ok, 1 refused (stderr names the field), 2 usage (switchboard/cli.py).
"""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import CommandParser

from queues import access, services
from queues.access import HumanActor, SystemActor, human_or_system
from queues.models import Endpoint, EndpointState
from queues.schemas import endpoint_out, vend_out
from switchboard.core.cli import (
    SwitchboardCommand,
    add_as_option,
    as_user,
    emit,
    integer,
    named_user,
    number,
    refused,
    usage,
)
from switchboard.core.errors import DomainError, NotFound
from switchboard.core.times import iso


def _csv(value: str) -> list[str]:
    """A comma-separated list, the spaces around each comma left out ("inbox, outbox"); each
    name is then the service's to check as the API's are: a trailing newline, or an empty name
    ("a,,b"), was stripped or dropped here, so the CLI took what the API refuses."""
    return [part.strip(" ") for part in value.split(",")]


def _user(username: str, flag: str) -> Any:
    return named_user(username, flag)


def cli_actor(options: dict[str, Any]) -> HumanActor | SystemActor:
    """The human named by --as, or the system (the shell's operator, recorded as system:cli)."""
    username = options.get("as_user")
    return human_or_system(as_user(username) if username is not None else None, via="cli")


class Command(SwitchboardCommand):
    help = (
        "Vend, list and revoke endpoints (agents' credentials and scopes), and rotate their "
        "ready hooks' signing secret."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="subcommand", title="subcommands")

        vend = sub.add_parser("vend", help="create an endpoint and print its token once")
        vend.add_argument("--owner", required=True, metavar="USER", help="the owning human")
        vend.add_argument("--name", required=True, help="a human name for the agent")
        vend.add_argument(
            "--queues", required=True, type=_csv, help="comma-separated queue names it may use"
        )
        vend.add_argument(
            "--verbs",
            type=_csv,
            default=None,
            help="comma-separated verbs to grant (default: the basic todo verbs)",
        )
        vend.add_argument(
            "--lease-ttl",
            type=integer,
            default=None,
            metavar="S",
            help="seconds a claim is leased when the agent names none (1 to 86400; default 300)",
        )
        vend.add_argument(
            "--rps", type=number, default=None, help="request rate limit (0 = unlimited)"
        )
        vend.add_argument(
            "--burst",
            type=integer,
            default=None,
            help="the most requests at once (default: twice --rps, or the fleet's burst)",
        )
        vend.add_argument("--slug", default=None, help="the URL slug (default: from the name)")
        vend.add_argument("--json", action="store_true", help="print JSON")
        add_as_option(vend)
        vend.set_defaults(handler=self.vend)

        listing = sub.add_parser("list", help="list endpoints")
        listing.add_argument("--owner", default=None, metavar="USER")
        listing.add_argument("--state", choices=["active", "revoked"], default=None)
        listing.add_argument("--json", action="store_true", help="print JSON")
        listing.set_defaults(handler=self.list)

        revoke = sub.add_parser(
            "revoke", help="revoke an endpoint; its live todos are dead-lettered"
        )
        revoke.add_argument("slug", metavar="SLUG")
        revoke.add_argument("--json", action="store_true", help="print JSON")
        add_as_option(revoke)
        revoke.set_defaults(handler=self.revoke)

        rotate = sub.add_parser(
            "rotate-hook-secret",
            help="a new signing secret for the ready hooks; the old one signs too for --overlap",
        )
        rotate.add_argument("slug", metavar="SLUG")
        rotate.add_argument(
            "--overlap",
            type=integer,
            default=None,
            metavar="S",
            help="seconds the old secret still signs (default HOOK_SECRET_OVERLAP_SECONDS)",
        )
        rotate.add_argument("--json", action="store_true", help="print JSON")
        add_as_option(rotate)
        rotate.set_defaults(handler=self.rotate_hook_secret)

    def handle(self, *args: Any, **options: Any) -> None:
        handler = options.get("handler")
        if handler is None:
            raise usage("name a subcommand: endpoint vend|list|revoke|rotate-hook-secret")
        try:
            handler(options)
        except DomainError as exc:
            refused(self, options, exc)

    def vend(self, options: dict[str, Any]) -> None:
        owner = _user(options["owner"], "--owner")
        endpoint, token = services.endpoint_vend(
            owner=owner,
            name=options["name"],
            queues=options["queues"],
            verbs=options["verbs"],
            lease_ttl_seconds=options["lease_ttl"],
            rps=options["rps"],
            burst=options["burst"],
            slug=options["slug"],
            actor=cli_actor(options),
        )
        data = vend_out(endpoint, token)
        text = "\n".join(
            [
                f"slug:    {endpoint.slug}",
                f"token:   {token}   (shown once; only its hash is kept)",
                f"MCP URL: {data['mcp_url']}",
                f"grant:   {', '.join(endpoint.scope_verbs)}",
                "",
                ".mcp.json:",
                json.dumps(data["mcp_json"], indent=2),
            ]
        )
        emit(self, options, data, text)

    def list(self, options: dict[str, Any]) -> None:
        qs = Endpoint.objects.select_related("owner").order_by("slug")
        if options["owner"] is not None:  # "" is a mistake (a usage error), never "everyone's"
            qs = qs.filter(owner=_user(options["owner"], "--owner"))
        if options["state"]:
            qs = qs.filter(state=options["state"])
        rows = [endpoint_out(e) for e in qs]
        lines = [
            f"{r['slug']:<24} {r['state']:<8} {r['owner']:<12} "
            f"queues={','.join(r['scope_queues'])} verbs={len(r['scope_verbs'])}"
            for r in rows
        ]
        emit(self, options, {"endpoints": rows}, "\n".join(lines) or "no endpoints")

    def revoke(self, options: dict[str, Any]) -> None:
        actor = cli_actor(options)
        endpoint = _endpoint(options["slug"], actor)
        was = endpoint.state
        count = services.endpoint_revoke(endpoint=endpoint, actor=actor)
        # The service's contract: the state it wrote lands on ``endpoint``, and only then.
        changed = was != EndpointState.REVOKED and endpoint.state == EndpointState.REVOKED
        endpoint.refresh_from_db()
        data = {"endpoint": endpoint_out(endpoint), "dead_lettered": count, "changed": changed}
        text = (
            f"revoked {endpoint.slug}; {count} live todo(s) dead-lettered"
            if changed
            else f"{endpoint.slug} was already revoked (at {iso(endpoint.revoked_at)}); "
            "nothing changed"
        )
        emit(self, options, data, text)

    def rotate_hook_secret(self, options: dict[str, Any]) -> None:
        actor = cli_actor(options)
        endpoint = _endpoint(options["slug"], actor)
        secret = services.endpoint_rotate_hook_secret(
            endpoint=endpoint, actor=actor, overlap_seconds=options["overlap"]
        )
        until = endpoint.notify_secret_previous_until
        data = {
            "endpoint": endpoint_out(endpoint),
            "hook_secret": secret,
            "previous_secret_signs_until": iso(until),
        }
        text = f"hook secret: {secret}   (shown once)\n" + (
            f"the old secret also signs until {iso(until)}"
            if until
            else "the old secret no longer signs"
        )
        emit(self, options, data, text)


def _endpoint(slug: str, actor: Any) -> Endpoint:
    """The endpoint the acting human may change; one they may not read is not found, as on the
    API (a forbidden answer would tell them it exists)."""
    if isinstance(actor, HumanActor):
        endpoint = access.visible_endpoint(actor, slug)
    else:  # the machine operator's shell acts on any endpoint
        endpoint = Endpoint.objects.select_related("owner").filter(slug=slug).first()
    if endpoint is None:
        raise NotFound(f"no endpoint with slug {slug!r}", field="slug")
    return endpoint
