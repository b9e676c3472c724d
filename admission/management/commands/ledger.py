"""``manage.py ledger verify [--json]``: recompute the hash chain and check every policy against
its last audited state. Exit 0 when sound; 2 naming the exact row and what differs."""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from switchboard.core.cli import emit, usage
from switchboard.ledger import chain as ledger

EXIT_TAMPERED = 2


class Command(BaseCommand):
    help = "Check the ledger: ledger verify [--json]."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="subcommand", title="subcommands")
        verify = sub.add_parser(
            "verify",
            help="recompute the chain and compare every live policy with its audit",
            description="Exit 0 when the ledger is sound; 2 naming the first bad row (seq, "
            "position) and what differs, and every policy changed outside the audited path.",
        )
        verify.add_argument("--json", action="store_true", help="print JSON")
        verify.add_argument(
            "--batch", type=_positive, default=ledger.VERIFY_BATCH, help=argparse.SUPPRESS
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options.get("subcommand") != "verify":
            raise usage("name a subcommand: ledger verify [--json]")
        report = ledger.check(batch=options["batch"])
        emit(self, options, report.as_dict(), _text(report))
        if not report.ok:
            raise CommandError("the ledger does not verify", returncode=EXIT_TAMPERED)


# The batch is a LIMIT; past this it only costs memory (and past a bigint, the query fails).
MAX_BATCH = 100_000


def _positive(value: str) -> int:
    n = int(value)
    if not 1 <= n <= MAX_BATCH:
        raise argparse.ArgumentTypeError(f"must be between 1 and {MAX_BATCH}")
    return n


def _text(report: ledger.VerifyReport) -> str:
    lines = []
    if report.chain is None:
        lines.append(f"chain: ok ({report.rows} rows, head seq {report.head_seq or 0})")
    else:
        c = report.chain
        lines.append(
            f"chain: BROKEN at seq {c.seq}, position {c.position}: {c.problem}: {c.detail}"
        )
    if report.drift:
        lines.append(f"policies: {len(report.drift)} of {report.policies} differ from the ledger")
        lines += [f"  {d.scope}/{d.queue}: {d.problem}: {d.detail}" for d in report.drift]
    else:
        lines.append(f"policies: ok ({report.policies} match their last audited state)")
    return "\n".join(lines)
