"""``manage.py todo push ENDPOINT QUEUE --title T [--payload JSON] [--key K] [--pool P]
[--tag T ...] [--rate-limit R]``: put work in.

Acts as the endpoint's owner (the operator at the shell stands in for them). ``--key`` is the
idempotency key: while a todo with it is live, pushing again returns that todo (created: false).
Exit codes: 0 ok, 1 refused (stderr names the field), 2 usage (switchboard/cli.py).
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandParser

from queues import services
from queues.access import HumanActor
from queues.models import Endpoint, TodoSource
from queues.schemas import one_todo_out
from switchboard.core import validation
from switchboard.core.cli import SwitchboardCommand, emit, integer, refused, usage
from switchboard.core.errors import DomainError, NotFound


class Command(SwitchboardCommand):
    help = "Put todos on an endpoint's queue."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="subcommand", title="subcommands")
        push = sub.add_parser("push", help="create a todo on ENDPOINT's QUEUE")
        push.add_argument("endpoint", metavar="ENDPOINT", help="the endpoint's slug")
        push.add_argument("queue", metavar="QUEUE")
        push.add_argument("--title", required=True)
        push.add_argument("--payload", default=None, metavar="JSON", help="any JSON value")
        push.add_argument("--key", default=None, help="idempotency key")
        push.add_argument("--kind", default="")
        push.add_argument("--max-attempts", type=integer, default=None, metavar="N")
        push.add_argument("--pool", default=None, help="a declared pool")
        push.add_argument(
            "--tag", dest="tags", action="append", default=None, help="a declared tag (repeatable)"
        )
        push.add_argument("--rate-limit", default=None, help="a declared rate limit")
        push.add_argument("--json", action="store_true", help="print JSON")
        push.set_defaults(handler=self.push)

    def handle(self, *args: Any, **options: Any) -> None:
        handler = options.get("handler")
        if handler is None:
            raise usage("name a subcommand: todo push")
        try:
            handler(options)
        except DomainError as exc:
            refused(self, options, exc)

    def push(self, options: dict[str, Any]) -> None:
        endpoint = Endpoint.objects.select_related("owner").filter(slug=options["endpoint"]).first()
        if endpoint is None:
            raise NotFound(f"no endpoint with slug {options['endpoint']!r}", field="endpoint")
        payload = None
        if options["payload"] is not None:
            payload = validation.loads(options["payload"], "payload")
        made = services.todo_create(
            actor=HumanActor(endpoint.owner, via="cli"),
            endpoint=endpoint,
            queue=options["queue"],
            title=options["title"],
            kind=options["kind"],
            payload=payload,
            idempotency_key=options["key"],
            max_attempts=options["max_attempts"],
            pool=options["pool"],
            tags=options["tags"],
            rate_limit=options["rate_limit"],
            source=TodoSource.CLI,
        )
        todo = one_todo_out(made.todo)
        data: dict[str, Any] = {"todo": todo, "created": made.created}
        if made.created:
            verb = "created"
        elif made.differs:
            # The key was given to other work: this request's is not created (as the API says).
            data["differs"] = made.differs
            verb = f"not created: the key belongs to a live todo that differs in {', '.join(made.differs)}"
        else:
            data["differs"] = []
            verb = "already live (same key)"
        text = f"{verb}: {todo['id']} on {endpoint.slug}/{todo['queue']}: {todo['title']}"
        emit(self, options, data, text)
