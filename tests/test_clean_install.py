"""A fresh machine: `make run` from a virtualenv of requirements.txt alone, and the README's first
screen run as written against it.

Every other test runs in the dev virtualenv, where requirements-dev.txt can hide a runtime
dependency that requirements.txt lacks (kombu's Redis transport imports `packaging`; without it
the web server starts and the Celery worker dies). So the Makefile's own install step builds a
virtualenv from requirements.txt alone (once per module; pip's cache makes it quick), `make run`
starts from it on a fresh data folder and a non-default port, and the tests below drive that one
console from outside, in order: the README's commands, an agent over MCP at the URL `endpoint
vend` printed, a sweep through the real broker, /metrics with the printed token, and at the end,
every process still up 20 s after the start and SIGTERM stopping all of it with exit status 0.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pty
import re
import select
import shutil
import subprocess
import tempfile
import termios
import time
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest
import yaml
from celery import Celery
from mcp import Client
from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client

from tests.console import (
    BASE_DIR,
    Console,
    console_env,
    embedded_servers_of,
    gone,
    status,
    web_port,
)

BUILD_TIMEOUT = 600.0
COMMAND_TIMEOUT = 120.0
ALIVE_FOR = 20.0
# The sweeps' beat interval for this console: short, so beat's first sweeps fall inside the test
# (the default is 30 s). A documented setting, passed as an operator would.
SWEEP_INTERVAL = "4"
SUPERUSER = "night-owl"
SUPERUSER_PASSWORD = "a-long-test-password"


def readme_commands(section: str, language: str = "sh") -> list[str]:
    """The fenced ``language`` blocks of a README section, joined; for sh, one command a line
    with comments dropped."""
    text = (BASE_DIR / "README.md").read_text()
    assert f"\n## {section}\n" in text, f"the README has no section {section!r}"
    body = text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(rf"```{language}\n(.*?)```", body, re.S)
    assert blocks, f"no {language} block in the README's {section!r}"
    if language != "sh":
        return blocks
    lines = (line.split(" #", 1)[0].strip() for block in blocks for line in block.splitlines())
    return [line for line in lines if line and not line.startswith("#")]


@pytest.fixture(scope="module")
def root() -> Iterator[Path]:
    # Short, under /tmp: the PostgreSQL socket lives in the data folder (socket paths ≤ ~107 bytes).
    path = Path(tempfile.mkdtemp(prefix="sb-clean-")).resolve()
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def clean_venv(root: Path) -> Path:
    """The virtualenv `make run` makes on a fresh machine: the Makefile's own step, with VENV
    pointed away from the dev virtualenv."""
    venv = root / "venv"
    built = subprocess.run(
        ["make", "--no-print-directory", f"VENV={venv}", f"{venv}/.stamp-run"],
        cwd=BASE_DIR,
        # No bytecode compiled at install (about half of an install from pip's cache, and of the
        # files to delete after): Python compiles what the console imports when it imports it.
        env={**console_env(root / "data"), "PIP_COMPILE": "no"},  # pip install --no-compile
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT,
    )
    assert built.returncode == 0, built.stdout[-4000:] + built.stderr[-4000:]
    return venv


@pytest.fixture(scope="module")
def console(root: Path, clean_venv: Path) -> Iterator[Console]:
    port = web_port()
    data = root / "data"
    env = console_env(data, SWEEP_INTERVAL_SECONDS=SWEEP_INTERVAL)
    argv = ["make", "--no-print-directory", "run", f"PORT={port}", f"VENV={clean_venv}"]
    running = Console(argv, data, port, env)
    try:
        running.wait_ready()
        yield running
    finally:
        running.kill_everything()


def manage(console: Console, venv: Path, command: str) -> subprocess.CompletedProcess[str]:
    """A README command line, typed in a second terminal, with the clean virtualenv as .venv."""
    assert command.startswith(".venv/bin/python manage.py "), command
    return subprocess.run(
        ["bash", "-c", command.replace(".venv/bin/python", f"{venv}/bin/python", 1)],
        cwd=BASE_DIR,
        env=console_env(console.data_dir),
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT,
    )


def in_a_terminal(
    console: Console, venv: Path, command: str, answers: list[tuple[str, str]]
) -> str:
    """Run an interactive command on a pseudo-terminal, answering each prompt in turn."""
    master, terminal = pty.openpty()

    def own_the_terminal() -> None:
        # A session of its own with the pty as its controlling terminal, so getpass reads it.
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    process = subprocess.Popen(
        ["bash", "-c", command.replace(".venv/bin/python", f"{venv}/bin/python", 1)],
        cwd=BASE_DIR,
        env=console_env(console.data_dir),
        stdin=terminal,
        stdout=terminal,
        stderr=terminal,
        preexec_fn=own_the_terminal,
    )
    os.close(terminal)
    seen, answered = "", 0
    deadline = time.monotonic() + COMMAND_TIMEOUT
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if not ready:
                if process.poll() is not None:
                    break
                continue
            try:
                chunk = os.read(master, 4096).decode(errors="replace")
            except OSError:  # the command closed the terminal
                break
            if not chunk:
                break
            seen += chunk
            while answered < len(answers) and answers[answered][0] in seen:
                seen = seen.split(answers[answered][0], 1)[1]
                os.write(master, f"{answers[answered][1]}\n".encode())
                answered += 1
        code = process.wait(timeout=10)
    finally:
        if process.poll() is None:
            process.kill()
        os.close(master)
    assert code == 0 and answered == len(answers), f"exit {code}, {answered} answers:\n{seen}"
    return seen


@contextlib.asynccontextmanager
async def connect(url: str, token: str) -> AsyncIterator[Client]:
    """A connected SDK client; its HTTP client is ours to close (the SDK closes only one it
    made itself)."""
    async with (
        create_mcp_http_client(headers={"Authorization": f"Bearer {token}"}) as http,
        Client(streamable_http_client(url, http_client=http)) as client,
    ):
        yield client


def wait_for_line(console: Console, pattern: str, timeout: float = 60.0) -> re.Match[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = re.search(pattern, console.output)
        if found:
            return found
        console.assert_up()
        time.sleep(0.2)
    pytest.fail(f"no line matching {pattern!r} within {timeout:.0f} s:\n{console.output}")


def test_the_virtualenv_holds_requirements_txt_alone(clean_venv: Path) -> None:
    for dev_only in ("pytest", "mcp", "deptry"):
        probe = subprocess.run([clean_venv / "bin" / "python", "-c", f"import {dev_only}"])
        assert probe.returncode != 0, f"{dev_only} is installed in the clean virtualenv"


def test_make_run_starts_web_worker_beat_and_both_embedded_servers(console: Console) -> None:
    console.assert_up()
    assert readme_commands("The two commands")[:2] == ["make run", "make test"]
    assert "exec make test" in (BASE_DIR / ".ci" / "run").read_text()  # make test: CI runs it

    commands = [" ".join(p.cmdline()) for p in console.descendants if not gone(p)]
    assert any("manage.py serve --port" in c for c in commands), commands
    assert any("uvicorn switchboard.asgi:application" in c for c in commands), commands
    assert any("celery" in c and " worker" in c for c in commands), commands
    assert any("celery" in c and " beat" in c for c in commands), commands
    # The names as listed: a backend of the server may exit before a second read of its /proc.
    names = [p.info["name"] for p in embedded_servers_of(console.data_dir)]
    assert any("postgres" in n for n in names) and any("valkey" in n for n in names), names
    assert status(console.url + "admin/login/") == 200


def test_the_readme_commands_run_and_the_vended_mcp_url_works(
    console: Console, clean_venv: Path
) -> None:
    console.assert_up()
    outputs: dict[str, str] = {}
    for command in readme_commands("The two commands")[2:]:
        if command.endswith(" createsuperuser"):
            in_a_terminal(
                console,
                clean_venv,
                command,
                [
                    ("Username", SUPERUSER),
                    ("Email address:", ""),
                    ("Password:", SUPERUSER_PASSWORD),
                    ("Password (again):", SUPERUSER_PASSWORD),
                ],
            )
            continue
        done = manage(console, clean_venv, command)
        assert done.returncode == 0, f"{command}\n{done.stdout}{done.stderr}"
        outputs[command.split(" manage.py ", 1)[1].split()[0]] = done.stdout
    assert {"endpoint", "todo", "queue", "ledger"} <= set(outputs)

    made = manage(
        console,
        clean_venv,
        ".venv/bin/python manage.py shell -c "
        f"\"from django.contrib.auth.models import User; print(User.objects.get(username='{SUPERUSER}').is_superuser)\"",
    )
    assert made.stdout.splitlines()[-1:] == ["True"], made.stdout + made.stderr

    vended = outputs["endpoint"]
    token = re.search(r"^token:\s+(sbk_\S+)", vended, re.M)
    mcp_url = re.search(r"^MCP URL:\s+(\S+)", vended, re.M)
    assert token and mcp_url, vended
    assert mcp_url[1] == f"{console.url}mcp/night-shift"  # the port make run serves, not 8000
    snippet = json.loads(vended.split(".mcp.json:", 1)[1])
    assert snippet["mcpServers"]["switchboard-night-shift"]["url"] == mcp_url[1]

    seen: dict[str, Any] = {}

    async def look() -> None:
        async with connect(mcp_url[1], token[1]) as client:
            listed = await client.call_tool("list_todos", {"queue": "inbox"})
            seen["listed"] = listed.structured_content

    console.assert_up()
    anyio.run(look)
    assert [t["title"] for t in seen["listed"]["todos"]] == ["Summarise the incident channel"]
    assert seen["listed"]["paused_queues"] == ["inbox"]


def test_the_operator_api_vends_the_address_make_run_serves(
    console: Console, clean_venv: Path
) -> None:
    console.assert_up()
    made = manage(
        console, clean_venv, ".venv/bin/python manage.py token create --user operator --json"
    )
    assert made.returncode == 0, made.stdout + made.stderr
    human_token = json.loads(made.stdout)["token"]
    request = urllib.request.Request(
        f"{console.url}api/v1/endpoints",
        data=json.dumps({"name": "API agent", "queues": ["research"]}).encode(),
        headers={"Authorization": f"Bearer {human_token}", "Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 201
        vended = json.loads(response.read())
    assert vended["mcp_url"] == f"{console.url}mcp/api-agent"
    seen: dict[str, Any] = {}

    async def look() -> None:
        async with connect(vended["mcp_url"], vended["token"]) as client:
            seen["tools"] = {t.name for t in (await client.list_tools()).tools}

    anyio.run(look)
    assert "claim_next" in seen["tools"]


def test_a_sweep_sent_through_the_broker_runs_on_its_worker_and_beat_sends_sweeps(
    console: Console,
) -> None:
    console.assert_up()
    # The demo agent from the first-run banner claims with a one-second lease and goes silent.
    demo = re.search(r"Endpoint triage: token (sbk_\S+)\s+MCP (\S+)", console.output)
    assert demo, console.output
    assert demo[2] == f"{console.url}mcp/triage"
    seen: dict[str, Any] = {}

    async def claim_and_go_silent() -> None:
        async with connect(demo[2], demo[1]) as client:
            claimed = await client.call_tool(
                "claim_next", {"queue": "research", "lease_ttl_seconds": 1}
            )
            assert claimed.structured_content is not None
            seen["todo"] = claimed.structured_content["todo"]["id"]

    anyio.run(claim_and_go_silent)
    time.sleep(1.5)

    valkey_port = int((console.data_dir / "valkey" / "port").read_text())
    task_id = f"clean-install-{uuid.uuid4()}"
    sender = Celery("sender", broker=f"redis://127.0.0.1:{valkey_port}/0", set_as_current=False)
    sender.send_task("queues.tasks.reap_expired", task_id=task_id)
    wait_for_line(console, rf"queues\.tasks\.reap_expired\[{task_id}\] succeeded in \S+: \d+")

    async def read_back() -> None:
        async with connect(demo[2], demo[1]) as client:
            got = await client.call_tool("get_todo", {"id": seen["todo"]})
            assert got.structured_content is not None
            seen["state"] = got.structured_content["todo"]["state"]

    anyio.run(read_back)
    assert seen["state"] == "pending"  # reaped: the lapsed claim is claimable again

    wait_for_line(console, r"Sending due task reap-expired \(queues\.tasks\.reap_expired\)")
    wait_for_line(console, r"queues\.tasks\.requeue_due_retries\[[^\]]+\] succeeded")


def test_metrics_answer_the_printed_token_and_the_readme_scrape_config(console: Console) -> None:
    console.assert_up()
    token = re.search(r"bearer token: (\S+)", console.output)
    kept = re.search(r"\(kept in (\S+)\)", console.output)
    assert token and kept, console.output
    assert Path(kept[1]) == console.data_dir / "metrics_token"
    assert Path(kept[1]).read_text().strip() == token[1]
    assert status(console.url + "metrics") == 401

    # Scrape as Prometheus would with the README's config, the checkout path and port filled in.
    config = yaml.safe_load(readme_commands("Prometheus", "yaml")[0])
    job = config["scrape_configs"][0]
    assert job["static_configs"][0]["targets"] == ["127.0.0.1:8000"]
    target = f"127.0.0.1:{console.port}"
    auth = job["authorization"]
    credentials_file = auth["credentials_file"].replace(
        "/path/to/switchboard/.data", str(console.data_dir)
    )
    credentials = Path(credentials_file).read_text().strip()
    request = urllib.request.Request(
        f"http://{target}{job['metrics_path']}",
        headers={"Authorization": f"{auth['type']} {credentials}"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200
        body = response.read().decode()
    assert "switchboard_todos_created_total" in body


def test_every_process_stays_up_20_seconds_and_sigterm_stops_all_with_exit_0(
    console: Console,
) -> None:
    console.assert_up()
    time.sleep(max(0.0, console.ready_at + ALIVE_FOR - time.monotonic()))

    console.assert_up()
    down = [" ".join(p.cmdline()) for p in console.descendants if gone(p)]
    assert not down, f"gone after {ALIVE_FOR:.0f} s: {down}\n{console.output}"
    embedded = embedded_servers_of(console.data_dir)
    names = [p.info["name"] for p in embedded]  # as listed: a backend may exit in between
    assert any("postgres" in n for n in names) and any("valkey" in n for n in names), names

    assert console.stop() == 0, console.output
    _, alive = psutil.wait_procs([*console.descendants, *embedded], timeout=10)
    alive = [p for p in alive if not gone(p)]
    assert not alive, f"left running after make run exited: {alive}"
    assert not embedded_servers_of(console.data_dir)
