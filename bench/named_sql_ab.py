"""The SQL of the named claim cycle before and after ledger migration 0010 and limits migration
0007, as two files for ``python -m bench.claim_profile --named --history --swap``: each file
puts its version of the functions and of the ledger's two kind CHECKs in place, so one run
alternates them on one database and backend (issue 13's A/B, interleaved on a shared machine).

``python -m bench.named_sql_ab DIR`` writes ``DIR/before.sql`` and ``DIR/after.sql``.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

# The ledger's kind CHECKs as Django wrote them before 0010 (kind IN (...)), and as 0010 does.
_KIND_CHECK_BEFORE = "((kind)::text = ANY ((ARRAY[{}])::text[]))"
_CHAIN_CHECK_BEFORE = (
    "((chain = 0) OR ((chain <= 8) AND ((kind)::text = ANY "
    "((ARRAY['limits.grant'::character varying, 'limits.end'::character varying])::text[]))))"
)


def _checks(kind: str, chain: str) -> str:
    return (
        "ALTER TABLE admission_ledgerentry DROP CONSTRAINT IF EXISTS ledger_kind_valid, "
        f"ADD CONSTRAINT ledger_kind_valid CHECK {kind};\n"
        "ALTER TABLE admission_ledgerentry DROP CONSTRAINT IF EXISTS ledger_chain_valid, "
        f"ADD CONSTRAINT ledger_chain_valid CHECK {chain};\n"
    )


def write(directory: Path) -> tuple[Path, Path]:
    from switchboard.ledger.models import LedgerKind

    m5 = importlib.import_module("admission.limits.migrations.0005_headroom_locks")
    m6 = importlib.import_module("admission.limits.migrations.0006_reopen_functions")
    m7 = importlib.import_module("admission.limits.migrations.0007_fewer_statements_per_check")
    m10 = importlib.import_module("switchboard.ledger.migrations.0010_lean_grant_append")
    kinds = ", ".join(f"'{k}'::character varying" for k in LedgerKind.values)
    before = (
        _checks(_KIND_CHECK_BEFORE.format(kinds), _CHAIN_CHECK_BEFORE)
        + m10.PREVIOUS_APPEND_FUNCTION
        + m5.POOL_CHECK
        + m5.TAGS_CHECK
        + m5.SHARED_READS  # the reopens of 0006 read through these
        + m6.FUNCTIONS
    )
    kind_after = "(kind::text = ANY ('{" + ",".join(LedgerKind.values) + "}'::text[]))"
    chain_after = (
        "(chain = 0 OR (chain <= 8 AND kind::text = ANY ('{limits.grant,limits.end}'::text[])))"
    )
    after = (
        _checks(kind_after, chain_after)
        + m10.APPEND_FUNCTION
        + m7.POOL_CHECK
        + m7.TAGS_CHECK
        + m7.REOPENS
        + m7.DROP_SHARED_READS
    )
    directory.mkdir(parents=True, exist_ok=True)
    paths = directory / "before.sql", directory / "after.sql"
    paths[0].write_text(before)
    paths[1].write_text(after)
    return paths


def main(argv: list[str] | None = None) -> int:
    import os

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m bench.named_sql_ab DIR", file=sys.stderr)
        return 2
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "switchboard.settings")
    import django

    django.setup()
    for path in write(Path(args[0])):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
