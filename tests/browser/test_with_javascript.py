"""The console in Chromium with JavaScript on: htmx swaps, the live board, focus management."""

from __future__ import annotations

import re
import time
from typing import Any
from urllib.parse import parse_qsl, quote, urlsplit

import pytest
from django.contrib.sessions.models import Session as StoredSession
from playwright.sync_api import expect

from admission.models import AdmissionPolicy
from queues import pauses
from queues.models import QueuePause, Todo, TodoState
from switchboard.console import live
from switchboard.ledger.models import LedgerEntry
from tests.browser.conftest import DESKTOP, WIDTHS, Session, screenshot
from tests.browser.helpers import LIVE, api_post, budget, findings, until
from tests.conftest import Personas, audit_rows, push


def test_an_owner_edits_a_budget_through_a_preview_and_sees_a_bad_zone_refused_inline(
    session: Session, tx_personas: Personas, relaxed_policy_writes: Any
) -> None:
    p = tx_personas
    push(p, 2)
    page = session.page(p.owner)
    page.goto("/")
    page.get_by_role("link", name="Set a budget").first.click()
    expect(page).to_have_url(re.compile(r"/budgets/agent/inbox$"))
    expect(page.locator("#id_max_in_flight")).to_be_focused()

    page.fill("#id_max_in_flight", "2")
    page.fill("#id_max_claims_per_window", "5")
    page.fill("#id_window_tz", "Mars/Olympus_Mons")
    page.get_by_role("button", name="Preview change").click()
    error = page.locator("#id_window_tz-error")
    expect(error).to_contain_text("not a known IANA time zone")
    expect(page.locator("#id_window_tz")).to_have_value("Mars/Olympus_Mons")
    expect(page.locator("#id_window_tz")).to_have_attribute("aria-invalid", "true")
    expect(page.locator("#id_window_tz")).to_be_focused()
    expect(page.locator("#id_max_claims_per_window")).to_have_value("5")
    assert not AdmissionPolicy.objects.exists()

    page.fill("#id_window_tz", "Europe/Paris")
    page.get_by_role("button", name="Preview change").click()
    preview = page.locator(".preview")
    expect(preview).to_contain_text("0 of 5")
    expect(preview).to_contain_text("0 of 2")
    expect(preview).to_contain_text("Admitted")
    expect(page.get_by_role("button", name="Save budget")).to_be_focused()
    screenshot(page, "editor")
    page.get_by_role("button", name="Save budget").click()

    expect(page).to_have_url(re.compile(r"/#edit-agent--inbox$"))
    expect(page.locator("#edit-agent--inbox")).to_be_focused()
    expect(page.locator("#head-agent--inbox")).to_contain_text("0 of 5")
    policy = AdmissionPolicy.objects.get(endpoint=p.agent, queue="inbox")
    assert (policy.max_in_flight, policy.max_claims_per_window, policy.window_tz) == (
        2,
        5,
        "Europe/Paris",
    )
    assert LedgerEntry.objects.filter(kind="policy.create", actor_human_name="olive").count() == 1


def test_an_owner_clears_a_budget_after_confirming(
    session: Session, tx_personas: Personas, relaxed_policy_writes: Any
) -> None:
    p = tx_personas
    budget(p, max_in_flight=1)
    page = session.page(p.owner)
    page.goto("/budgets/agent/inbox")
    page.get_by_role("link", name="Clear budget…").click()
    expect(page.get_by_role("heading", level=1)).to_contain_text("Clear the budget")
    page.get_by_role("button", name="Clear budget").click()
    expect(page).to_have_url(re.compile(r"/#edit-agent--inbox$"))
    expect(page.locator("#edit-agent--inbox")).to_be_focused()
    assert not AdmissionPolicy.objects.exists()
    assert LedgerEntry.objects.filter(kind="policy.delete").count() == 1


def test_a_superuser_pauses_and_resumes_a_queue_from_the_board(
    session: Session, tx_personas: Personas
) -> None:
    p = tx_personas
    push(p, 1)
    page = session.page(p.admin)
    page.goto("/?endpoint=agent&queue=inbox")
    head = page.locator("#head-agent--inbox")
    expect(head.locator(".badge")).to_have_text("Healthy")
    page.fill("#pause-agent--inbox-reason", "upgrading the consumer")
    page.get_by_role("button", name="Pause").click()
    expect(head.locator(".badge")).to_have_text("Paused")
    expect(head).to_contain_text("upgrading the consumer")
    expect(head).to_contain_text("drained")
    expect(page.locator("#cards-agent--inbox .chip")).to_have_text("paused · waits for resume")
    assert QueuePause.objects.filter(queue="inbox", paused_by=p.admin).exists()

    page.get_by_role("button", name="Resume inbox").click()
    expect(head.locator(".badge")).to_have_text("Healthy")
    assert not QueuePause.objects.exists()
    kinds = list(audit_rows().order_by("seq").values_list("kind", flat=True))
    assert kinds == ["queue.pause", "queue.resume"]


def test_a_pauser_pauses_from_the_queue_page_and_a_blank_reason_is_refused(
    session: Session, tx_personas: Personas
) -> None:
    p = tx_personas
    push(p, 1)
    page = session.page(p.pauser)
    page.goto("/queues/inbox")
    page.fill("#pause-queue-reason", "   ")
    page.get_by_role("button", name="Pause").click()
    expect(page.locator("#pause-queue-error")).to_contain_text("a reason is required")
    assert not QueuePause.objects.exists()
    page.fill("#pause-queue-reason", "draining for the upgrade")
    page.get_by_role("button", name="Pause").click()
    expect(page.locator(".queue-pause")).to_contain_text("Paused by paul")
    expect(page.locator(".queue-pause")).to_contain_text("drained")
    page.get_by_role("button", name="Resume inbox").click()
    expect(page.locator(".queue-pause")).to_contain_text("Healthy")
    assert not QueuePause.objects.exists()


def test_the_board_header_changes_live_after_claims_made_through_the_api(
    session: Session, tx_personas: Personas, server: str
) -> None:
    p = tx_personas
    push(p, 3)
    budget(p, max_claims_per_window=2)
    page = session.page(p.owner)
    page.goto("/")
    head = page.locator("#head-agent--inbox")
    expect(head.locator(".badge")).to_have_text("Healthy")
    expect(page.locator("[data-live-url]")).to_have_attribute("data-live", "open")
    expect(page.get_by_text("Updates live.")).to_be_visible()  # said where it is so

    claimed = api_post(server, "/api/v1/agent/claim_next", p.agent_token)
    assert claimed["empty"] is False
    expect(head.locator(".counts div").nth(1)).to_contain_text("1", timeout=LIVE)
    expect(head).to_contain_text("1 of 2", timeout=LIVE)

    api_post(server, "/api/v1/agent/claim_next", p.agent_token)
    expect(head.locator(".badge")).to_have_text("Deferred · window used up", timeout=LIVE)
    expect(page.locator("#announcer")).to_contain_text("agent / inbox: Deferred", timeout=LIVE)
    chip = page.locator("#cards-agent--inbox .chip")
    expect(chip).to_contain_text("Deferred · window used up · eligible")
    expect(chip).to_contain_text(re.compile(r"E[SD]T"))  # the viewer's zone: America/New_York
    screenshot(page, "board")


@pytest.mark.parametrize("width", WIDTHS)
def test_a_filtered_board_stays_filtered_while_the_queue_changes_live(
    session: Session, tx_personas: Personas, width: int
) -> None:
    """The filter form swaps the list by htmx (no page load): the live stream must follow the
    new filters, or its next change to the queue sends the unfiltered cards into the results.
    Back restores the unfiltered board, and the stream follows it again."""
    p = tx_personas
    push(p, 3, payload={"ref": "ordinary"})
    push(p, 1, payload={"ref": "INV-4242"})
    page = session.page(p.owner, width=width)
    page.goto("/")
    cards = page.locator("#cards-agent--inbox .card")
    expect(cards).to_have_count(4)
    root = page.locator("[data-live-url]")
    expect(root).to_have_attribute("data-live", "open")

    page.get_by_label("Search").fill("INV-4242")
    page.get_by_role("button", name="Filter").click()
    page.wait_for_url(re.compile(r"[?&]q=INV-4242"))
    expect(cards).to_have_count(1)
    expect(root).to_have_attribute("data-live-url", re.compile(r"[?&]q=INV-4242"))
    expect(root).to_have_attribute("data-live", "open", timeout=LIVE)

    push(p, 2, payload={"ref": "ordinary"})  # a change to the same queue, outside the search
    push(p, 1, payload={"ref": "INV-4242 reissued"})  # and one inside it
    expect(cards).to_have_count(2, timeout=LIVE)
    expect(cards.filter(has_text="todo 0")).to_have_count(2)
    expect(page.get_by_label("Search")).to_have_value("INV-4242")

    page.go_back()  # htmx fetches the unfiltered page and swaps in its body, a new root
    page.wait_for_url(re.compile(r"/$"))
    expect(page.get_by_label("Search")).to_have_value("", timeout=LIVE)
    # The new root says "open" only once live.js has subscribed for it.
    expect(root).to_have_attribute("data-live", "open", timeout=LIVE)
    expect(root).not_to_have_attribute("data-live-url", re.compile(r"q=INV"))
    push(p, 1, payload={"ref": "ordinary"})
    expect(cards).to_have_count(8, timeout=LIVE)


# The page's EventSource replaced by one the test drives: each stream the page opens is kept in
# window.__streams, and emit() dispatches an event on it as a server's would. What the live board
# does with an event that arrives at a given moment is then exact, not left to the host's timing.
DRIVEN_STREAMS = """
window.__streams = [];
window.EventSource = class {
  constructor(url) {
    this.url = url;
    this.readyState = 0;
    this.listeners = {};
    window.__streams.push(this);
    setTimeout(() => { this.readyState = 1; this.fire("open", {}); }, 0);
  }
  addEventListener(type, listener) { (this.listeners[type] = this.listeners[type] || []).push(listener); }
  close() { this.readyState = 2; }
  fire(type, event) { (this.listeners[type] || []).forEach((listener) => listener(event)); }
  emit(type, data) { this.fire(type, { data: JSON.stringify(data) }); }
};
"""


def _search_page(session: Session, p: Personas, width: int = DESKTOP) -> tuple[Any, Any, str]:
    """The board with four cards (one whose payload says INV-4242) on driven streams, subscribed;
    with the unfiltered list's HTML, as the stream being left would send it again."""
    push(p, 3, payload={"ref": "ordinary"})
    push(p, 1, payload={"ref": "INV-4242"})
    page = session.page(p.owner, width=width)
    page.add_init_script(DRIVEN_STREAMS)
    page.goto("/")
    cards = page.locator("#cards-agent--inbox .card")
    expect(cards).to_have_count(4)
    expect(page.locator("[data-live-url]")).to_have_attribute("data-live", "open")
    unfiltered = page.evaluate("document.getElementById('sections').outerHTML")
    page.get_by_label("Search").fill("INV-4242")
    return page, cards, unfiltered


def _follows_the_search(page: Any, cards: Any) -> None:
    """The search's one card shows and stays, the stream of the unfiltered board is closed and
    one for the search is open."""
    page.wait_for_url(re.compile(r"[?&]q=INV-4242"))
    expect(cards).to_have_count(1)
    until(
        page,
        "() => window.__streams.length === 2 && window.__streams[0].readyState === 2"
        " && /[?&]q=INV-4242/.test(window.__streams[1].url)",
    )
    page.wait_for_timeout(300)  # whatever the page would still do with the stale list
    expect(cards).to_have_count(1)
    assert page.evaluate("document.querySelectorAll('#sections .card').length") == 1


def _sent_list(page: Any, html: str) -> None:
    """The stream the page opened first sends a whole list, ``html``."""
    page.evaluate(
        "html => window.__streams[0].emit('swap', {target: 'sections', html: html})", html
    )


def _inbox_board(
    session: Session, p: Personas, badge: str, width: int = DESKTOP
) -> tuple[Any, Any, str]:
    """The admin's board filtered to the agent's inbox on driven streams, subscribed, its head
    showing ``badge``; with the head and the list's HTML."""
    page = session.page(p.admin, width=width)
    page.add_init_script(DRIVEN_STREAMS)
    page.goto("/?endpoint=agent&queue=inbox")
    head = page.locator("#head-agent--inbox")
    expect(head.locator(".badge")).to_have_text(badge)
    expect(page.locator("[data-live-url]")).to_have_attribute("data-live", "open")
    return page, head, page.evaluate("document.getElementById('sections').outerHTML")


def _the_search(url: str) -> bool:
    return urlsplit(url).path == "/" and "q=INV-4242" in url


def _the_pause(url: str) -> bool:
    return urlsplit(url).path.endswith("/queues/inbox/pause")


def _held(page: Any, matches: Any, send: Any, meanwhile: Any, release: Any) -> None:
    """``send()`` the request ``matches`` picks by its URL, hold it on its way while
    ``meanwhile()`` runs, then ``release`` it (continue, abort)."""
    held: list[Any] = []

    def hold(route: Any) -> None:
        held.append(route)

    page.route(matches, hold)
    send()
    deadline = time.monotonic() + 10
    while not held and time.monotonic() < deadline:
        page.wait_for_timeout(20)
    assert held, f"the request {matches.__name__} picks was not sent"
    meanwhile()
    release(held[0])
    page.unroute(matches)  # after the release: unrouting lets a held request go on its own


@pytest.mark.parametrize("width", WIDTHS)
def test_a_list_sent_by_the_stream_being_left_while_the_search_loads_is_not_shown(
    session: Session, tx_personas: Personas, width: int
) -> None:
    """The stream of the unfiltered board sends its whole list while the search's request is on
    its way: the list must not replace the one the search is about to replace (htmx would then
    swap the results into an element no longer on the page, leaving the unfiltered cards under
    the search's address)."""
    page, cards, unfiltered = _search_page(session, tx_personas, width)
    _held(
        page,
        _the_search,
        page.get_by_role("button", name="Filter").click,
        lambda: _sent_list(page, unfiltered),
        lambda route: route.continue_(),
    )
    _follows_the_search(page, cards)


def test_a_list_held_while_a_search_loads_is_shown_when_the_search_fails(
    session: Session, tx_personas: Personas
) -> None:
    """Held, not dropped: when the search's request fails, the page keeps its filters and its
    stream, and the list that stream sent meanwhile is shown."""
    page, cards, unfiltered = _search_page(session, tx_personas)
    changed = unfiltered.replace(">todo 1<", ">todo 1 (changed)<", 1)
    assert changed != unfiltered

    def meanwhile() -> None:
        _sent_list(page, changed)
        page.wait_for_timeout(100)
        expect(cards.filter(has_text="(changed)")).to_have_count(0)  # held while it loads

    _held(
        page,
        _the_search,
        page.get_by_role("button", name="Filter").click,
        meanwhile,
        lambda route: route.abort(),
    )
    expect(cards.filter(has_text="todo 1 (changed)")).to_have_count(1)
    expect(cards).to_have_count(4)
    assert page.evaluate("window.__streams.length") == 1
    assert "q=" not in page.url


@pytest.mark.parametrize("width", WIDTHS)
def test_a_list_sent_by_the_stream_being_left_after_the_search_loaded_is_not_shown(
    session: Session, tx_personas: Personas, width: int
) -> None:
    """The stream of the unfiltered board sends its whole list once the search's request has
    ended, its results swapped in, and before live.js moved to the search's stream (htmx settles
    20 ms later): the results stay, and the stream moves."""
    page, cards, unfiltered = _search_page(session, tx_personas, width)
    page.evaluate(
        """html => document.body.addEventListener("htmx:afterOnLoad", function once() {
            document.body.removeEventListener("htmx:afterOnLoad", once);
            window.__streams[0].emit("swap", {target: "sections", html: html});
            window.__staleSent = true;
        })""",
        unfiltered,
    )
    page.get_by_role("button", name="Filter").click()
    until(page, "() => window.__staleSent === true")
    _follows_the_search(page, cards)


def test_a_list_sent_while_a_pause_loads_gives_way_to_the_paused_list_and_the_stream_resyncs(
    session: Session, tx_personas: Personas
) -> None:
    """The same filters: the pause's answer (the list, paused) is shown, not the list the stream
    sent while it loaded, and the stream is subscribed again from the paused list's fingerprint,
    so what changed since that list was rendered is sent."""
    p = tx_personas
    push(p, 1)
    page, head, healthy = _inbox_board(session, p, "Healthy")
    page.fill("#pause-agent--inbox-reason", "upgrading the consumer")
    _held(
        page,
        _the_pause,
        page.get_by_role("button", name="Pause").click,
        lambda: _sent_list(page, healthy),
        lambda route: route.continue_(),
    )
    expect(head.locator(".badge")).to_have_text("Paused")
    until(page, "() => window.__streams.length === 2 && window.__streams[0].readyState === 2")
    first, second = page.evaluate("window.__streams.map((s) => s.url)")
    assert _subject(first) == _subject(second)  # the same filters, from the new list's fingerprint
    assert first != second
    page.wait_for_timeout(300)
    expect(head.locator(".badge")).to_have_text("Paused")
    assert QueuePause.objects.filter(queue="inbox").exists()


def _the_resume(url: str) -> bool:
    return urlsplit(url).path.endswith("/queues/inbox/resume")


@pytest.mark.parametrize("width", WIDTHS)
def test_a_resume_whose_form_the_stream_replaced_while_it_loaded_still_frees_the_list(
    session: Session, tx_personas: Personas, width: int
) -> None:
    """The stream replaces the queue's controls (the resume form in them: nothing typed there
    holds it back) and sends a whole list while the resume loads. htmx then reports the
    request's end on that form, off the page: the list must not stay held for good. The resumed
    list shows, the stream is subscribed again from it, and a list that stream sends next is
    shown."""
    p = tx_personas
    push(p, 1)
    pauses.queue_pause(actor=p.as_human(p.admin), queue="inbox", reason="upgrading the consumer")
    page, head, paused = _inbox_board(session, p, "Paused", width)
    controls = page.evaluate("document.getElementById('controls-agent--inbox').outerHTML")

    def meanwhile() -> None:
        page.evaluate(
            """html => {
                window.__sent = document.querySelector("#controls-agent--inbox .resume-form");
                window.__streams[0].emit("swap", {target: "controls-agent--inbox", html: html});
            }""",
            controls,
        )
        assert page.evaluate("!document.body.contains(window.__sent)")  # the form that sent it
        _sent_list(page, paused)

    _held(
        page,
        _the_resume,
        page.get_by_role("button", name="Resume inbox").click,
        meanwhile,
        lambda route: route.continue_(),
    )
    expect(head.locator(".badge")).to_have_text("Healthy")
    until(page, "() => window.__streams.length === 2 && window.__streams[0].readyState === 2")
    resumed = page.evaluate("document.getElementById('sections').outerHTML")
    changed = resumed.replace(">todo 0<", ">todo 0 (changed)<", 1)
    assert changed != resumed
    page.evaluate(
        "html => window.__streams[1].emit('swap', {target: 'sections', html: html})", changed
    )
    expect(page.locator("#sections .card", has_text="todo 0 (changed)")).to_have_count(1)
    expect(head.locator(".badge")).to_have_text("Healthy")
    assert not QueuePause.objects.filter(queue="inbox").exists()


def _subject(url: str) -> tuple[str, list[tuple[str, str]]]:
    """What a stream URL subscribes to: its path and its query but the fingerprint ("at")."""
    parts = urlsplit(url)
    return parts.path, sorted((k, v) for k, v in parse_qsl(parts.query) if k != "at")


@pytest.mark.parametrize("width", WIDTHS)
def test_a_board_whose_viewer_signed_out_says_it_stopped_being_live(
    session: Session, tx_personas: Personas, monkeypatch: pytest.MonkeyPatch, width: int
) -> None:
    # Signed out in another tab, the board went on streaming for up to five minutes, then froze
    # without a word: a stale board passing for the fleet as it is.
    monkeypatch.setattr(live, "SESSION_CHECK_SECONDS", 0.5)
    p = tx_personas
    push(p, 1)
    page = session.page(p.owner, width=width)
    page.goto("/")
    root = page.locator("[data-live-url]")
    expect(root).to_have_attribute("data-live", "open")
    ended = page.locator("[data-live-ended]")
    expect(ended).to_be_hidden()
    page.get_by_role("search").get_by_label("Queue").select_option("inbox")  # the address moves
    page.get_by_role("button", name="Filter").click()
    expect(page).to_have_url(re.compile(r"queue=inbox"))
    expect(root).to_have_attribute("data-live", "open")
    StoredSession.objects.all().delete()
    expect(root).to_have_attribute("data-live", "closed", timeout=LIVE)
    expect(ended).to_be_visible()
    expect(ended).to_contain_text("This page stopped updating")
    here = page.evaluate("location.pathname + location.search")
    assert "queue=inbox" in here
    expect(ended.get_by_role("link", name="Reload it")).to_have_attribute("href", here)
    sign_in = ended.get_by_role("link", name="sign in again")
    expect(sign_in).to_have_attribute("href", "/login/?next=" + quote(here, safe=""))
    assert findings(page) == []
    assert page.evaluate("document.documentElement.scrollWidth") <= width  # no sideways scroll


def test_a_board_that_cannot_reach_the_server_says_so_until_it_is_back(
    session: Session, tx_personas: Personas
) -> None:
    p = tx_personas
    page = session.page(p.owner)
    page.route("**/live?*", lambda route: route.abort())
    page.goto("/")
    root = page.locator("[data-live-url]")
    lost = page.locator("[data-live-lost]")
    expect(root).to_have_attribute("data-live", "reconnecting")
    expect(lost).to_be_visible(timeout=LIVE)
    expect(lost).to_contain_text("may be out of date")
    page.unroute("**/live?*")
    expect(root).to_have_attribute("data-live", "open", timeout=LIVE)
    expect(lost).to_be_hidden()
    expect(page.locator("[data-live-ended]")).to_be_hidden()


@pytest.mark.parametrize("status", [502, 503])
def test_a_board_whose_stream_is_answered_an_error_keeps_trying_until_the_server_is_back(
    session: Session, tx_personas: Personas, status: int
) -> None:
    # EventSource gives up on any answer but a stream: a proxy's 502 or the server's 503 while
    # it restarted left the board "stopped updating" for good, frozen until reloaded by hand.
    p = tx_personas
    page = session.page(p.owner)
    # What a proxy in front answers while the server is away.
    page.route("**/live?*", lambda route: route.fulfill(status=status, body="restarting"))
    page.goto("/")
    root = page.locator("[data-live-url]")
    lost = page.locator("[data-live-lost]")
    expect(lost).to_be_visible(timeout=LIVE)
    expect(root).to_have_attribute("data-live", "reconnecting")
    expect(page.locator("[data-live-ended]")).to_be_hidden()
    page.unroute("**/live?*")
    expect(root).to_have_attribute("data-live", "open", timeout=LIVE)
    expect(lost).to_be_hidden()
    expect(page.locator("[data-live-ended]")).to_be_hidden()


def test_a_session_ended_under_the_board_signs_in_again_and_comes_back(
    session: Session, tx_personas: Personas
) -> None:
    # A fragment request after the session ended (signed out in another tab, or expired) was
    # redirected, the browser followed, and the whole sign-in page landed in the drawer.
    p = tx_personas
    push(p, 1)
    page = session.page(p.owner)
    page.goto("/?endpoint=agent&queue=inbox")
    StoredSession.objects.all().delete()
    page.get_by_role("link", name="todo 0").click()
    expect(page).to_have_url(re.compile(r"/login/\?next=/%3Fendpoint%3Dagent%26queue%3Dinbox$"))
    assert page.locator("#drawer").count() == 0
    page.get_by_label("Username").fill("olive")
    page.get_by_label("Password").fill("pw-olive-123")
    page.get_by_role("button", name="Sign in").click()
    expect(page).to_have_url(re.compile(r"/\?endpoint=agent&queue=inbox$"))
    page.get_by_role("link", name="todo 0").click()
    expect(page.locator("#drawer .todo-head")).to_contain_text("todo 0")


def test_an_operator_claims_and_completes_a_todo_in_the_drawer(
    session: Session, tx_personas: Personas
) -> None:
    p = tx_personas
    (todo,) = push(p, 1, payload={"url": "https://example.org/report"})
    page = session.page(p.owner)
    page.goto("/?endpoint=agent&queue=inbox")
    page.get_by_role("link", name="todo 0").click()
    drawer = page.locator("#drawer")
    expect(drawer).to_contain_text("https://example.org/report")
    expect(page).to_have_url(re.compile(r"/\?endpoint=agent&queue=inbox$"))  # stayed on the board
    drawer.get_by_role("button", name="Claim as operator:olive").click()
    expect(drawer).to_contain_text("Claimed")
    expect(drawer.locator(".todo-head .state-label")).to_have_text("claimed")
    drawer.locator("#complete-summary").fill("done by hand")
    # A result the edge refuses: the drawer comes back with both fields as typed, the
    # refusal beside the result, the todo still claimed.
    drawer.locator("#complete-result").fill('{"a": NaN}')
    drawer.get_by_role("button", name="Complete").click()
    expect(drawer.locator("#complete-result-error")).to_contain_text("finite number")
    expect(drawer.locator("#complete-summary")).to_have_value("done by hand")
    expect(drawer.locator("#complete-result")).to_have_value('{"a": NaN}')
    expect(drawer.locator("#complete-result")).to_be_focused()  # where the fix is to be made
    expect(drawer.locator(".todo-head .state-label")).to_have_text("claimed")
    drawer.locator("#complete-result").fill("")
    drawer.get_by_role("button", name="Complete").click()
    expect(drawer.locator(".todo-head .state-label")).to_have_text("done")
    expect(drawer.locator(".attempts")).to_contain_text("done by hand")
    todo.refresh_from_db()
    assert todo.state == TodoState.DONE
    attempt = todo.attempts.get()
    assert (attempt.via, attempt.claimant) == ("board", "operator:olive")
    assert Todo.objects.filter(state=TodoState.DONE).count() == 1
