"""The failed tests named again as the last lines of pytest's report, above its final count.

On CI (the CI variable set) pytest's short summary gives each failure's message whole, and a test
that asserts on a console's output puts all of that output there: the tail of the log that
``issues ci`` shows then ended inside it, and did not name the test (CI on 72fa9cd). Wired in by
``tests/conftest.py``; a plugin of its own, so a test can run pytest with it alone.
"""

from __future__ import annotations

from collections.abc import Generator

import pytest


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> Generator[None]:
    # The outermost wrapper: this runs after pytest's own short summary.
    try:
        return (yield)
    finally:
        named: dict[str, str] = {}
        for kind in ("failed", "error"):
            for report in terminalreporter.stats.get(kind, []):
                named.setdefault(report.nodeid or str(report.fspath), kind.upper())
        if named:
            terminalreporter.write_sep("=", f"{len(named)} failed or in error, named again")
            for nodeid, kind in named.items():
                terminalreporter.write_line(f"{kind} {nodeid}")
