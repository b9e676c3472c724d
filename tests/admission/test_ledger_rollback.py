"""A rolled-back ledger: a database writer who kept an earlier signed head deletes the rows after
it and puts that head back. The chain then verifies on its own; the stored check's high-water mark
(the furthest head any check saw) catches it, also once the chain has grown past the mark again,
and an anchor printed by ``ledger verify`` and kept elsewhere catches it when the stored check was
rolled back too. The heads are also Prometheus gauges, a record outside the database."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client
from django.utils import timezone

from switchboard.ledger import chain as ledger
from switchboard.ledger.models import LedgerCheck, LedgerEntry, LedgerHead
from tests.admission.test_ledger import build_chain, delete, run_verify
from tests.conftest import run_threads


def saved_head() -> dict[str, Any]:
    return dict(
        LedgerHead.objects.filter(pk=0).values("seq", "chain_pos", "entry_hash", "mac").get()
    )


def roll_back(to: dict[str, Any]) -> None:
    """Delete chain 0's rows after the saved head and put that head back, as its signature is."""
    for seq in LedgerEntry.objects.filter(chain=0, seq__gt=to["seq"]).values_list("seq", flat=True):
        delete(seq)
    LedgerHead.objects.filter(pk=0).update(**to)


def test_a_rolled_back_tail_verifies_alone_but_not_against_the_last_check(db: None) -> None:
    build_chain(3)
    earlier = saved_head()
    build_chain(2)
    assert ledger.check().ok  # the mark: chain position 5
    lost = LedgerEntry.objects.filter(chain=0).order_by("-seq").values_list("seq", flat=True)[0]
    roll_back(earlier)

    assert ledger.verify().ok  # the chain alone cannot tell
    report = ledger.check()
    assert not report.ok and report.chain is not None
    assert (report.chain.problem, report.chain.seq, report.chain.position) == ("deleted", lost, 4)
    assert "rolled back: its signed head is at chain position 3" in report.chain.detail
    assert "chain position 5" in report.chain.detail
    # It stays caught: the mark is kept, never lowered by the failing check.
    assert not ledger.check().ok
    stored = LedgerCheck.objects.get(pk=1)
    assert not stored.ok and stored.report["high_water"]["0"]["rows"] == 5


def test_a_rollback_the_chain_has_grown_past_since_is_still_caught(db: None) -> None:
    build_chain(3)
    earlier = saved_head()
    build_chain(2)
    assert ledger.check().ok
    roll_back(earlier)
    build_chain(4)  # the app appends on: position 7, past the mark of 5
    report = ledger.check()
    assert not report.ok and report.chain is not None
    assert "the row at chain position 5 is another row" in report.chain.detail
    # The next check, nothing changed, still says so (it took the new heads as the mark and
    # cleared the alarm); only a reset of the mark, by someone who dealt with it, clears it.
    assert not ledger.check().ok
    build_chain(1)
    assert not ledger.check().ok
    assert run_verify("--reset-mark")[0] == 0
    assert ledger.check().ok


def test_checks_while_the_ledger_grows_never_false_alarm(transactional_db: None) -> None:
    build_chain(1)

    def work(i: int) -> list[bool]:
        if i < 3:
            build_chain(8)
            return []
        return [ledger.check().ok for _ in range(6)]

    verdicts = [ok for oks in run_threads(5, work) for ok in oks]
    assert verdicts and all(verdicts)
    assert ledger.check().ok
    # The mark is the furthest head any of them saw: the last, whatever order they stored in.
    assert LedgerCheck.objects.get(pk=1).report["high_water"]["0"]["rows"] == 25


def test_a_stored_check_from_before_the_mark_still_guards_the_position(db: None) -> None:
    # Reports stored before high_water existed record each chain's rows and head seq only.
    build_chain(3)
    earlier = saved_head()
    build_chain(2)
    report = ledger.verify().as_dict()
    report.pop("high_water")
    for head in report["chains"].values():
        head.pop("head_hash")
    LedgerCheck.objects.create(pk=1, checked_at=timezone.now(), ok=True, report=report)
    roll_back(earlier)
    assert not ledger.check().ok


def anchors(text: str) -> list[str]:
    return re.findall(r"^  (\d+:\d+:[0-9a-f]{64})$", text, re.M)


def test_an_anchor_kept_elsewhere_catches_a_rollback_of_the_stored_check_too(db: None) -> None:
    build_chain(3)
    earlier = saved_head()
    build_chain(2)
    code, out = run_verify()
    assert code == 0
    [anchor] = anchors(out)
    head = saved_head()
    assert anchor == f"0:5:{head['entry_hash']}"
    assert run_verify("--expect", anchor)[0] == 0

    roll_back(earlier)
    LedgerCheck.objects.all().delete()  # the writer rolls the stored check back as well
    assert run_verify()[0] == 0
    code, out = run_verify("--expect", anchor)
    assert code == 3
    # The row is gone, so no seq is known for it: the problem names the chain position. The
    # anchor is a person's to type, so both readings are said, not a rollback alone.
    assert (
        f"chain: MISMATCH: the anchor given, chain position 5 (hash {anchor[4:16]}…), does not "
        "match this ledger: its signed head is at chain position 3" in out
    )
    assert "Either the anchor was mistyped or taken from another ledger, or rows were " in out


def test_every_anchor_given_is_checked_not_only_a_chains_last(db: None) -> None:
    # The anchors were kept by chain: of two given for one chain only the last was checked, so
    # `--expect <mistyped> --expect <good>` exited 0 and the reverse order 3.
    build_chain(3)
    code, out = run_verify()
    [early] = anchors(out)
    build_chain(2)
    code, out = run_verify()
    [late] = anchors(out)
    assert run_verify("--expect", early, "--expect", late)[0] == 0
    typo = early[:-1] + ("0" if early[-1] != "0" else "1")
    for given in ([typo, late], [late, typo]):
        code, out = run_verify(*(arg for anchor in given for arg in ("--expect", anchor)))
        assert code == 3, out
        assert "chain: MISMATCH: the anchor given, chain position 3 " in out, out


@pytest.mark.parametrize(
    "mark",
    [
        {"0": {"rows": "x", "head_seq": 5}},
        {"0": {}},
        {"zero": {"rows": 5}},
        {"0": 5},
        ["0", 5],
    ],
    ids=["rows-text", "no-rows", "chain-word", "not-an-object", "a-list"],
)
def test_a_stored_mark_not_written_by_a_check_is_a_finding_not_a_crash(db: None, mark: Any) -> None:
    # A writer who rolled the ledger back and made the stored mark unreadable: every check
    # crashed (TypeError, KeyError, ValueError), so --expect could not say the rollback and
    # "Verify now" was a 500, while the verdict stayed the green the writer left.
    build_chain(3)
    earlier = saved_head()
    build_chain(2)
    code, out = run_verify()
    assert code == 0
    [anchor] = anchors(out)
    roll_back(earlier)
    LedgerCheck.objects.filter(pk=1).update(ok=True, report={"high_water": mark})
    code, out = run_verify("--expect", anchor)
    assert code == 3
    assert "the stored check's mark of the furthest heads seen is not one a check writes" in out
    stored = LedgerCheck.objects.get(pk=1)
    assert not stored.ok  # the badge and /metrics say so
    # Dealt with: the mark forgotten, the chain as it is verifies, and the anchor still finds
    # the rows it names gone.
    LedgerCheck.objects.all().delete()
    assert run_verify()[0] == 0
    assert run_verify("--expect", anchor)[0] == 3


def test_an_anchor_is_its_holders_evidence_and_never_the_fleets_verdict(
    db: None, settings: Any
) -> None:
    """A mistyped anchor raised everyone's alarm (the stored check, the badge, /metrics) until
    the next check, without it, cleared it again."""
    build_chain(3)
    code, out = run_verify()
    [anchor] = anchors(out)
    typo = anchor[:-1] + ("0" if anchor[-1] != "0" else "1")
    code, out = run_verify("--expect", typo)
    assert code == 3 and "chain position 3" in out and "another row" in out
    assert "the anchor was mistyped or taken from another ledger" in out
    assert "BROKEN" not in out and "was recorded before" not in out
    stored = LedgerCheck.objects.get(pk=1)
    assert stored.ok and stored.report["chain"]["ok"]
    settings.METRICS_TOKEN = "metrics-token"
    metrics = Client().get("/metrics", headers={"Authorization": "Bearer metrics-token"})
    assert "switchboard_ledger_check_ok 1.0" in metrics.content.decode()
    assert run_verify("--expect", anchor)[0] == 0


def test_an_anchor_off_by_its_last_digit_is_shown_apart_from_the_row(db: None) -> None:
    # Both hashes were cut to 12 characters: "(hash 30eb12a1016d…) … another row (30eb12a1016d…)".
    build_chain(3)
    code, out = run_verify()
    [anchor] = anchors(out)
    real = anchor.rsplit(":", 1)[1]
    typo = real[:-1] + ("0" if real[-1] != "0" else "1")
    code, out = run_verify("--expect", f"0:3:{typo}")
    assert code == 3
    assert f"(hash {typo}…)" in out and f"is another row ({real}…)" in out


@pytest.mark.parametrize(
    ("anchor", "says"),
    [
        ("0:5", "must be CHAIN:POSITION:HASH"),
        ("x:5:" + "a" * 64, "must be CHAIN:POSITION:HASH"),
        ("99:5:" + "a" * 64, "chain must be 0 to 8"),
        ("0:5:abc", "the hash must be the 64 hex digits"),
        ("0:0:" + "a" * 64, "the position must be at least 1"),
    ],
)
def test_a_malformed_anchor_is_a_usage_error_naming_the_option(
    db: None, anchor: str, says: str
) -> None:
    with pytest.raises(CommandError, match=f"--expect.*{says}"):
        call_command("ledger", "verify", "--expect", anchor)


def test_the_heads_and_the_last_check_are_prometheus_gauges(db: None, settings: Any) -> None:
    build_chain(4)
    ledger.check()
    settings.METRICS_TOKEN = "t-ledger"
    body = Client().get("/metrics", HTTP_AUTHORIZATION="Bearer t-ledger").content.decode()
    assert 'switchboard_ledger_head_position{chain="0"} 4.0' in body
    assert 'switchboard_ledger_head_position{chain="8"} 0.0' in body
    assert "switchboard_ledger_check_ok 1.0" in body
    assert "switchboard_ledger_checked_timestamp_seconds " in body
