"""``manage.py limits``: declare, change, quarantine, inspect and verify the fleet-wide named
limits, and set queue priorities.

    limits pool create NAME --slots N [--posture P]
    limits tag set TAG --limit N [--posture P]
    limits rate set NAME --base-limit N [--floor N] [--decay-window S] [--decay-step N]
                    [--posture P]
    limits queue create NAME [--priority N] [--aging S]
    limits queue pause NAME [--reason TEXT] [--create]
    limits queue pause NAME --resume
    limits quarantine pool|tag NAME
    limits status [--json]
    limits verify [--json]
    limits list [--json]                    (every declared limit)
    limits set pool|tag|rate NAME [...]     (the same writes as create/set above)
    limits delete pool|tag|rate NAME

Writes take ``--as USER`` (the acting human; else the only superuser) and ``--json``. Exit codes:
0 ok, 1 refused (the field is named), 2 usage (switchboard/core/cli.py); ``verify`` exits 3 (a
finding) when the ledger or a grant does not verify, as ``ledger verify`` does.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from admission.limits import selectors, services
from admission.limits.verify import LimitsReport, limits_verify
from queues import cli_pause
from queues.access import HumanActor
from switchboard.core import versions
from switchboard.core.cli import (
    SwitchboardCommand,
    acting_human,
    add_common_options,
    emit,
    integer,
    refused,
    usage,
    version_argument,
)
from switchboard.core.errors import DomainError
from switchboard.core.times import iso

EXIT_FINDING = 3  # as ledger verify's: a finding, never 2 (a usage error) or 1 (a refusal)
DEFAULT_PAUSE_REASON = "paused with manage.py limits queue pause"

_OPTIONS = {
    "slots": ("--slots", "pool: claims naming it at once (0 holds them all)"),
    "limit": ("--limit", "tag: claims naming it at once (0 holds them all)"),
    "base_limit": ("--base-limit", "rate: claims per minute with no 429 in the decay window"),
    "floor": ("--floor", "rate: the least claims per minute however many 429s"),
    "decay_window_seconds": ("--decay-window", "rate: seconds a 429 keeps the limit halved"),
    "decay_step": ("--decay-step", "rate: halvings per 429 in the window (default 1, 0: none)"),
}
# The numeric options of each kind's own verb, and which of them it requires.
_KIND_VERBS = {
    "pool": ("create", ("slots",), "slots"),
    "tag": ("set", ("limit",), "limit"),
    "rate": ("set", ("base_limit", "floor", "decay_window_seconds", "decay_step"), "base_limit"),
}


def _line(limit: dict[str, Any]) -> str:
    numbers = ", ".join(
        f"{k}={v}" for k, v in limit.items() if k not in ("kind", "name", "posture", "version")
    )
    return f"{limit['kind']} {limit['name']}: {numbers} ({limit['posture']})"


def _if_version(parser: CommandParser) -> None:
    parser.add_argument(
        "--if-version",
        metavar="V",
        type=version_argument("limits list --json"),
        help="write only over this version of the limit (its `version`, as list --json prints "
        "it; none: only where it is not declared yet); if the limit is not as read, nothing is "
        "written (exit 1, precondition_failed)",
    )


def _status_text(status: dict[str, Any]) -> str:
    lines = [
        f"pool {p['name']}: {p['held']}/{p['slots']} held ({p['posture']})" for p in status["pools"]
    ]
    lines += [
        f"tag {t['name']}: {t['held']}/{t['limit']} held ({t['posture']})" for t in status["tags"]
    ]
    lines += [
        f"rate {r['name']}: effective {r['effective_limit']}/min of base {r['base_limit']} "
        f"({r['observations']} 429s in window, {r['used_this_minute']} this minute; {r['posture']})"
        for r in status["rates"]
    ]
    lines += [
        f"queue {q['queue']}: priority {q['priority']}, aging "
        + (f"{q['aging_seconds']}s" if q["aging_seconds"] else "none")
        for q in status["queues"]
    ]
    quarantines = status["quarantines"]
    lines.append(
        f"grants held: {status['grants']}; waivers: {status['waivers']}; quarantines: "
        f"{len(quarantines['in_force'])} in force"
        + (f" ({', '.join(quarantines['in_force'])})" if quarantines["in_force"] else "")
        + f", {quarantines['recorded']} recorded"
    )
    return "\n".join(lines)


def _verify_text(report: LimitsReport) -> str:
    chain = report.ledger.chain
    lines = [f"chain: ok ({report.ledger.rows} rows)" if chain is None else f"chain: {chain.said}"]
    if report.ledger.drift:
        # Each named, as ``ledger verify`` names them: "policies: 1 differ" said nothing of which.
        lines.append(f"policies: {len(report.ledger.drift)} differ from the ledger")
        lines += [f"  {d.scope}/{d.queue}: {d.problem}: {d.detail}" for d in report.ledger.drift]
    if report.drift:
        lines.append(f"grants: {len(report.drift)} of {report.grants} the limits refuse")
        lines += [
            f"  {d.kind} {d.name}: todo {d.todo} attempt {d.attempt}, grant at row {d.seq} "
            f"({iso(d.at)}): {d.held} held of {d.limit} ({d.posture}): {d.problem}"
            for d in report.drift
        ]
    else:
        lines.append(f"grants: ok ({report.grants} replayed against the limits in force)")
    return "\n".join(lines)


class Command(SwitchboardCommand):
    help = "Declare, quarantine, inspect and verify pools, tag limits and rate limits."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="subcommand", title="subcommands")
        for name, text in (("list", "every declared limit"), ("status", "how full each is")):
            p = sub.add_parser(name, help=text)
            p.add_argument("--json", action="store_true", help="print JSON")
        verify = sub.add_parser(
            "verify",
            help="recompute the ledger and replay every grant",
            description="Exit 0 when the ledger chain, every budget and limit (as the ledger last "
            "set them) and every grant (pool, tag and rate limit) verify; 3 (a finding) naming "
            "the first bad row, each budget or limit that differs from the ledger, or each grant "
            "the limits in force would have refused; 2 a usage error.",
        )
        verify.add_argument("--json", action="store_true", help="print JSON")
        setting = sub.add_parser("set", help="declare a limit or change the fields given")
        deleting = sub.add_parser("delete", help="remove a limit no live todo names")
        for p in (setting, deleting):
            p.add_argument("kind", choices=sorted(services.KINDS))
            p.add_argument("name", metavar="NAME")
            add_common_options(p)
            _if_version(p)
        for dest, (flag, text) in _OPTIONS.items():
            setting.add_argument(flag, dest=dest, type=integer, help=text)
        setting.add_argument("--posture", choices=["enforce", "advise", "off"])
        for kind, (verb, fields, required) in _KIND_VERBS.items():
            group = sub.add_parser(kind, help=f"{verb} a {kind} limit")
            verbs = group.add_subparsers(dest="verb", title="verbs")
            p = verbs.add_parser(verb, help=f"{verb} a {kind} limit (or change it)")
            p.add_argument("name", metavar="NAME")
            for dest in fields:
                flag, text = _OPTIONS[dest]
                p.add_argument(flag, dest=dest, type=integer, required=dest == required, help=text)
            p.add_argument("--posture", choices=["enforce", "advise", "off"])
            add_common_options(p)
            _if_version(p)
        queue = sub.add_parser("queue", help="queue priority and aging; pause and resume")
        qverbs = queue.add_subparsers(dest="verb", title="verbs")
        create = qverbs.add_parser("create", help="set a queue's priority and aging")
        create.add_argument("name", metavar="NAME")
        create.add_argument("--priority", type=integer, help="higher is claimed first (default 0)")
        aging = create.add_mutually_exclusive_group()  # one or the other, never both
        aging.add_argument(
            "--aging", dest="aging_seconds", type=integer, help="seconds of wait per priority step"
        )
        aging.add_argument("--no-aging", action="store_true", help="remove the aging")
        create.add_argument(
            "--if-version",
            metavar="V",
            type=version_argument("limits status --json"),
            help="write only over this version of the queue's settings (its `version`, as "
            "status --json prints it; none: only where it has none yet); if they are not as "
            "read, nothing is written (exit 1, precondition_failed)",
        )
        pause = qverbs.add_parser(
            "pause",
            help="pause a queue fleet-wide (a name in use, or any with --create), or resume it",
        )
        pause.add_argument("name", metavar="NAME")
        pause.add_argument(
            "--resume", action="store_true", help="resume it instead (takes no --reason, --create)"
        )
        pause.add_argument(
            "--create", action="store_true", help="pause a name nothing has used yet"
        )
        pause.add_argument(
            "--reason", help=f"why (shown everywhere; default {DEFAULT_PAUSE_REASON!r})"
        )
        for p in (create, pause):
            add_common_options(p)
        quarantine = sub.add_parser(
            "quarantine", help="limit a pool or tag to 0 and expire every claim naming it"
        )
        quarantine.add_argument("kind", choices=["pool", "tag"])
        quarantine.add_argument("name", metavar="NAME")
        add_common_options(quarantine)

    def handle(self, *args: Any, **options: Any) -> None:
        subcommand = options.get("subcommand")
        if subcommand == "list":
            found = [selectors.limit_out(limit) for limit in services.limits_list()]
            emit(self, options, found, "\n".join(map(_line, found)) or "no limits declared")
            return
        if subcommand == "status":
            status = selectors.limits_overview()
            emit(self, options, status, _status_text(status))
            return
        if subcommand == "verify":
            report = limits_verify()
            emit(self, options, report.as_dict(), _verify_text(report))
            if not report.ok:
                raise CommandError("the limits do not verify", returncode=EXIT_FINDING)
            return
        if subcommand not in ("set", "delete", "pool", "tag", "rate", "queue", "quarantine"):
            raise usage(
                "name a subcommand: limits pool|tag|rate|queue|quarantine|status|verify|"
                "list|set|delete"
            )
        if subcommand in ("pool", "tag", "rate", "queue") and not options.get("verb"):
            raise usage(f"name a verb: limits {subcommand} --help")
        if subcommand == "queue" and options["verb"] == "pause":
            self._pause(options)
            return
        actor = HumanActor(acting_human(options.get("as_user")), via="cli")
        try:
            self._write(subcommand, actor, options)
        except DomainError as exc:
            refused(self, options, exc)

    def _write(self, subcommand: str, actor: HumanActor, options: dict[str, Any]) -> None:
        expected = versions.named(options.get("if_version"))
        if subcommand in ("set", "pool", "tag", "rate"):
            kind = options["kind"] if subcommand == "set" else subcommand
            given = {k: options[k] for k in (*_OPTIONS, "posture") if options.get(k) is not None}
            limit = services.limit_set(
                actor=actor, kind=kind, name=options["name"], expected=expected, **given
            )
            emit(self, options, selectors.limit_out(limit), f"set {_line(limit)}")
        elif subcommand == "delete":
            limit = services.limit_delete(
                actor=actor, kind=options["kind"], name=options["name"], expected=expected
            )
            emit(self, options, limit, f"deleted {limit['kind']} {limit['name']}")
        elif subcommand == "quarantine":
            done = services.limit_quarantine(
                actor=actor, kind=options["kind"], name=options["name"]
            )
            manifest = done["manifest"]
            emit(
                self,
                options,
                done,
                f"quarantined {options['kind']} {options['name']}: "
                f"{len(manifest['expired'])} claim(s) expired, {len(manifest['queued'])} queued "
                f"(ledger {done['entry_hash'][:12]})",
            )
        else:
            settings = services.queue_settings_set(
                actor=actor,
                queue=options["name"],
                priority=options.get("priority"),
                aging_seconds=options.get("aging_seconds"),
                clear_aging=bool(options.get("no_aging")),
                expected=expected,
            )
            aging = settings["aging_seconds"]
            emit(
                self,
                options,
                settings,
                f"queue {settings['queue']}: priority {settings['priority']}, aging "
                + (f"{aging}s" if aging else "none"),
            )

    def _pause(self, options: dict[str, Any]) -> None:
        """The queue app's own pause and resume (``manage.py queue pause|resume``): the same
        service, output and refusals; a queue declared here counts as known."""
        declared = selectors.queue_declared(options["name"])
        if options.get("resume"):
            # A resume lifts a pause: it has no reason to record and creates nothing.
            if options.get("reason") is not None or options.get("create"):
                raise usage("--resume takes neither --reason nor --create (they are for a pause)")
            cli_pause.handle_resume(self, {**options, "queue": options["name"], "known": declared})
            return
        cli_pause.handle_pause(
            self,
            {
                **options,
                "queue": options["name"],
                "reason": DEFAULT_PAUSE_REASON
                if options.get("reason") is None
                else options["reason"],
                "create": bool(options.get("create")) or declared,
            },
        )
