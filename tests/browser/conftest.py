"""Browser tests: Playwright (sync API) driving Debian's Chromium against a live ASGI server.

The server is uvicorn serving ``switchboard.asgi.application`` on a free port, in a thread of the
test process, so the server-sent events of the live board really stream (pytest-django's
``live_server`` is a threaded WSGI server). Tests use ``transactional_db``: what they write is
committed, so the server's own connections see it. Chromium missing is a failure, not a skip.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from django.conf import settings
from django.test import Client
from playwright.sync_api import Browser, BrowserContext, Page, expect, sync_playwright

from tests.inprocess import uvicorn_thread

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
ARTIFACTS = Path(settings.BASE_DIR) / "tests" / "artifacts"
VIEWER_ZONE = "America/New_York"
# The two widths every console page is tried at: a laptop and a phone (iPhone 12-15 class).
DESKTOP = 1440
PHONE = 390
WIDTHS = (DESKTOP, PHONE)
# ms: how long a page's action or an ``expect`` waits before it fails. Playwright's expect waits 5 s
# by default, half its actions' bound; on a loaded CI machine a focus that moved after an htmx
# swap took longer than that (a run on three workers). A live board's updates wait ``LIVE``.
PAGE_TIMEOUT = 10_000
expect.set_options(timeout=PAGE_TIMEOUT)


# The running servers by URL, so a test's teardown can wait for its server to go quiet.
_SERVERS: dict[str, uvicorn.Server] = {}
QUIET_SECONDS = 15.0


def wait_until_quiet(base: str) -> None:
    """Wait until the server has no request in flight and no query of its own running.

    The database reset after each test TRUNCATEs every table in one statement, taking its locks
    one table at a time; a stream's read still running when the pages closed (a live board's
    snapshot, finished by its executor thread after the request was cancelled) takes its locks in
    another order, and PostgreSQL ends one of the two with "deadlock detected". Closing the pages
    ends the requests; this waits for their queries to end too.
    """
    from django.db import connection

    srv = _SERVERS[base]
    deadline = time.monotonic() + QUIET_SECONDS
    while srv.server_state.tasks and time.monotonic() < deadline:
        time.sleep(0.02)
    quiet_checks = 0
    while quiet_checks < 2 and time.monotonic() < deadline:
        with connection.cursor() as cursor:
            cursor.execute(
                """
                SELECT count(*) FROM pg_stat_activity
                WHERE datname = current_database() AND pid <> pg_backend_pid()
                  AND backend_type = 'client backend' AND state <> 'idle'
                """
            )
            busy = cursor.fetchone()[0]
        quiet_checks = quiet_checks + 1 if busy == 0 else 0
        time.sleep(0.02)


@pytest.fixture(scope="session")
def server(django_db_setup: Any) -> Iterator[str]:
    """uvicorn on 127.0.0.1:<free port> serving the ASGI app, for the whole session."""
    from switchboard.asgi import application

    with uvicorn_thread(application) as srv:
        url = f"http://127.0.0.1:{srv.config.port}"
        _SERVERS[url] = srv
        yield url


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(
            f"Chromium is missing at {CHROMIUM}: the browser tests need it. "
            "Run `bash .ci/install-browser` as root (apt-get install chromium)."
        )
    # Playwright's sync API keeps an event loop on the test thread; Django's guard against ORM
    # calls from async code would refuse the (synchronous) test code there. The guard is lifted
    # while the browser is open (one module at a time), as Playwright's docs advise for Django.
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            yield browser
            browser.close()
    finally:
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


@pytest.fixture
def relaxed_policy_writes(settings: Any) -> None:
    settings.POLICY_WRITE_RATE_LIMIT = (0, 0)


class Session:
    """Open pages as a persona: a signed-in browser context (JavaScript on or off)."""

    def __init__(self, browser: Browser, base: str) -> None:
        self.browser = browser
        self.base = base
        self.contexts: list[BrowserContext] = []

    def context(
        self,
        user: Any,
        *,
        javascript: bool = True,
        width: int = DESKTOP,
        tz: str | None = VIEWER_ZONE,
        **options: Any,
    ) -> BrowserContext:
        """A signed-in context; ``tz=None`` leaves the zone cookie for static/js/tz.js to set."""
        client = Client()
        client.force_login(user)
        context = self.browser.new_context(
            java_script_enabled=javascript,
            base_url=self.base,
            viewport={"width": width, "height": 900 if width >= DESKTOP else 844},
            accept_downloads=True,
            **options,
        )
        cookies: list[Any] = [
            {"name": "sessionid", "value": client.cookies["sessionid"].value, "url": self.base}
        ]
        if tz is not None:
            cookies.append({"name": "tz", "value": tz, "url": self.base})
        context.add_cookies(cookies)
        context.set_default_timeout(PAGE_TIMEOUT)
        self.contexts.append(context)
        return context

    def page(self, user: Any, *, javascript: bool = True, **options: Any) -> Page:
        return self.context(user, javascript=javascript, **options).new_page()

    def close(self) -> None:
        for context in self.contexts:
            context.close()
        wait_until_quiet(self.base)


@pytest.fixture
def session(browser: Browser, server: str, transactional_db: None) -> Iterator[Session]:
    s = Session(browser, server)
    yield s
    s.close()


# Screenshots are for a person to look at, and nothing reads them in a run: only taken when
# SWITCHBOARD_SCREENSHOTS is set (`SWITCHBOARD_SCREENSHOTS=1 make test`). Without them Chromium
# spent 4 to 12 % less CPU on test_phones.py and test_fleet_board.py (one A/B, two base runs).
SCREENSHOTS = os.environ.get("SWITCHBOARD_SCREENSHOTS", "") not in ("", "0")


def screenshot(page: Page, name: str, *, full_page: bool = True) -> Path | None:
    """``tests/artifacts/<name>.png`` of the page as it is now, when screenshots are asked for."""
    if not SCREENSHOTS:
        return None
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=full_page)
    return path


@pytest.fixture(autouse=True)
def _fast_passwords(settings: Any) -> None:
    """Personas are made per test; hashing their passwords slowly proves nothing here."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
