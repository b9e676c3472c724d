"""``manage.py ledger verify [--json] [--expect CHAIN:POSITION:HASH ...]``: recompute the hash
chain and check every policy against its last audited state. Exit 0 when sound; 3 (a finding)
naming the exact row and what differs, or the anchor the ledger does not hold. 2 stays a usage
error (``--expect garbage``), 1 a refusal, so a cron job tells a typo from a tampered ledger.

A sound run prints each chain's head as an anchor (``CHAIN:POSITION:HASH``). Kept outside the
database, an anchor given back later (``--expect``) proves the ledger still holds that row: a
database writer who rolls the chain back to an earlier signed head (and the stored check with it)
is caught there, and only there."""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import CommandError, CommandParser

from switchboard.core.cli import SwitchboardCommand, emit, integer, is_integer, usage
from switchboard.ledger import chain as ledger
from switchboard.ledger.models import LedgerCheck

# A finding: the chain broken, a policy changed outside the audit, or an anchor not held. Not 2,
# which is a usage error (switchboard/core/cli.py), nor 1, a refusal.
EXIT_FINDING = 3


class Command(SwitchboardCommand):
    help = "Check the ledger: ledger verify [--json] [--expect CHAIN:POSITION:HASH] [--reset-mark]."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="subcommand", title="subcommands")
        verify = sub.add_parser(
            "verify",
            help="recompute the chain and compare every live policy with its audit",
            description="Exit 0 when the ledger is sound; 3 (a finding) naming the first bad row "
            "(seq, position) and what differs, every policy changed outside the audited path, or "
            "an --expect anchor the ledger does not hold; 2 a usage error, 1 a refusal.",
        )
        verify.add_argument("--json", action="store_true", help="print JSON")
        verify.add_argument(
            "--expect",
            action="append",
            type=_anchor,
            default=[],
            metavar="CHAIN:POSITION:HASH",
            help="a head printed by an earlier verify (its anchors line): the ledger must still "
            "hold that row (repeatable; a mismatch is this run's finding, exit 3, not the stored "
            "check's verdict)",
        )
        verify.add_argument(
            "--reset-mark",
            action="store_true",
            help="forget the furthest heads earlier checks saw (after restoring an older backup, "
            "or once a reported rollback is dealt with): this check records the heads as they are",
        )
        verify.add_argument(
            "--batch", type=_positive, default=ledger.VERIFY_BATCH, help=argparse.SUPPRESS
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options.get("subcommand") != "verify":
            raise usage(
                "name a subcommand: ledger verify [--json] [--expect CHAIN:POSITION:HASH] "
                "[--reset-mark]"
            )
        if options["reset_mark"]:
            LedgerCheck.objects.filter(pk=1).delete()
            self.stderr.write("the stored high-water mark was forgotten")
        expect = [ledger.anchor_mark(*anchor) for anchor in options["expect"]]
        report = ledger.check(batch=options["batch"], expect=expect)
        emit(self, options, report.as_dict(), _text(report))
        if not report.ok:
            raise CommandError("the ledger does not verify", returncode=EXIT_FINDING)


# The batch is a LIMIT; past this it only costs memory (and past a bigint, the query fails).
MAX_BATCH = 100_000


def _positive(value: str) -> int:
    n = integer(value)
    if not 1 <= n <= MAX_BATCH:
        raise argparse.ArgumentTypeError(f"must be between 1 and {MAX_BATCH}")
    return n


def _anchor(value: str) -> tuple[int, int, str]:
    """``CHAIN:POSITION:HASH``, as a verify's anchors line prints it."""
    parts = value.split(":")
    if len(parts) != 3 or not all(is_integer(part) for part in parts[:2]):
        raise argparse.ArgumentTypeError("must be CHAIN:POSITION:HASH, as verify prints it")
    chain, position, entry_hash = int(parts[0]), int(parts[1]), parts[2].lower()
    if chain not in ledger.CHAINS:
        raise argparse.ArgumentTypeError(f"chain must be 0 to {max(ledger.CHAINS)}")
    if len(entry_hash) != 64 or any(ch not in "0123456789abcdef" for ch in entry_hash):
        raise argparse.ArgumentTypeError("the hash must be the 64 hex digits verify printed")
    if position < 1:
        raise argparse.ArgumentTypeError("the position must be at least 1")
    return chain, position, entry_hash


def _text(report: ledger.VerifyReport) -> str:
    lines = []
    if report.chain is None:
        lines.append(f"chain: ok ({report.rows} rows, head seq {report.head_seq or 0})")
        anchors = [
            f"{c}:{head['rows']}:{head['head_hash']}"
            for c, head in sorted(report.chains.items())
            if head["rows"]
        ]
        if anchors:
            lines.append("anchors (keep them elsewhere; --expect checks them later):")
            lines += [f"  {a}" for a in anchors]
    else:
        lines.append(f"chain: {report.chain.said}")
    if report.drift:
        lines.append(f"policies: {len(report.drift)} of {report.policies} differ from the ledger")
        lines += [f"  {d.scope}/{d.queue}: {d.problem}: {d.detail}" for d in report.drift]
    else:
        lines.append(f"policies: ok ({report.policies} match their last audited state)")
    return "\n".join(lines)
