"""``manage.py serve`` (``make run``) and the embedded servers it runs, through what goes wrong:
a terminal's Ctrl-C, a launcher killed with SIGKILL, a second launcher on the same data folder,
and the embedded Valkey dying under it. One data folder for the module (its first start
migrates and seeds); each test starts its own launcher on it and leaves nothing running.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import psutil
import psycopg
import psycopg.conninfo
import psycopg.errors
import pytest
import redis
from django.db import connection

from queues.management.commands import serve
from switchboard.liveserver import current_database_url
from tests.console import Console, console_env, embedded_servers_of, gone, web_port

WAIT_SECONDS = 30.0  # generous: each of these happens within a few seconds


@pytest.fixture(scope="module")
def data_dir() -> Iterator[Path]:
    # Short, under /tmp: the PostgreSQL socket lives in it (socket paths are limited to ~107 bytes).
    path = Path(tempfile.mkdtemp(prefix="sb-life-")).resolve()
    yield path / "data"
    for process in embedded_servers_of(path / "data"):
        process.kill()
    shutil.rmtree(path, ignore_errors=True)


def _serve(data_dir: Path, port: int | None = None) -> Console:
    port = port or web_port()
    argv = [sys.executable, "manage.py", "serve", "--port", str(port)]
    return Console(argv, data_dir, port, console_env(data_dir))


def _valkey(data_dir: Path) -> psutil.Process:
    found = [p for p in embedded_servers_of(data_dir) if "valkey" in p.name()]
    assert len(found) == 1, found
    return found[0]


def _valkey_port(data_dir: Path) -> int:
    return int((data_dir / "valkey" / "port").read_text())


def _refuses_connections(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return True
    return False


def test_ctrl_c_stops_the_children_first_and_the_embedded_servers_last(data_dir: Path) -> None:
    serve = _serve(data_dir)
    try:
        serve.wait_ready()
        valkey = _valkey(data_dir)
        log = data_dir / "valkey" / "valkey.log"
        logged = log.stat().st_size
        # A terminal's Ctrl-C: SIGINT to the foreground process group, the launcher's.
        os.killpg(serve.launcher().pid, signal.SIGINT)
        assert serve.process.wait(timeout=WAIT_SECONDS) == 0, serve.output
        assert "Switchboard stopped." in serve.output
        # Valkey heard of the Ctrl-C from the launcher only (SIGTERM, once the children had
        # stopped), never from the terminal: in the launcher's group it stopped under them.
        with log.open("rb") as stopped:
            stopped.seek(logged)
            said = stopped.read().decode(errors="replace")
        assert "Received SIGTERM" in said and "Received SIGINT" not in said, said
        # The workers left a broker that was still up.
        assert "Connection to broker lost" not in serve.output, serve.output
        assert "Traceback" not in serve.output, serve.output
        psutil.wait_procs([valkey], timeout=WAIT_SECONDS)
        assert gone(valkey) and not embedded_servers_of(data_dir)
    finally:
        serve.kill_everything()


def test_a_valkey_left_by_a_killed_launcher_is_adopted_and_stopped_with_the_next(
    data_dir: Path,
) -> None:
    first = _serve(data_dir)
    second: Console | None = None
    try:
        first.wait_ready()
        valkey = _valkey(data_dir)
        first.launcher().kill()
        first.process.wait(timeout=WAIT_SECONDS)
        # The children follow their launcher (SIGTERM on its death); Valkey stays up.
        children = [p for p in first.descendants if p.pid != valkey.pid]
        _, alive = psutil.wait_procs(children, timeout=WAIT_SECONDS)
        assert not [p for p in alive if not gone(p)] and not gone(valkey)

        second = _serve(data_dir)
        second.wait_ready()
        assert "Valkey: adopted" in second.output, second.output
        assert second.stop() == 0, second.output
        psutil.wait_procs([valkey], timeout=WAIT_SECONDS)
        assert gone(valkey), "the adopted Valkey outlived the launcher:\n" + second.output
        assert _refuses_connections(_valkey_port(data_dir))
        assert not embedded_servers_of(data_dir)
    finally:
        first.kill_everything()
        if second is not None:
            second.kill_everything()


def test_a_second_launcher_on_the_same_data_folder_is_refused_and_records_nothing(
    data_dir: Path,
) -> None:
    first = _serve(data_dir)
    second: Console | None = None
    try:
        first.wait_ready()
        served_url = (data_dir / "served_url").read_text()
        assert served_url == first.url.rstrip("/") + "\n"
        second = _serve(data_dir)
        assert second.process.wait(timeout=WAIT_SECONDS) == 1
        assert f"Another launcher (pid {first.launcher().pid}, serving {served_url.strip()})" in (
            second.output
        ), second.output
        assert (data_dir / "served_url").read_text() == served_url
        first.assert_up()
        assert first.stop() == 0, first.output
    finally:
        first.kill_everything()
        if second is not None:
            second.kill_everything()


def test_a_launch_whose_web_server_cannot_listen_records_no_served_url(data_dir: Path) -> None:
    before = (data_dir / "served_url").read_text()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        serve = _serve(data_dir, taken.getsockname()[1])
        try:
            assert serve.process.wait(timeout=120) == 1, serve.output
            assert "web (uvicorn) child died unexpectedly" in serve.output, serve.output
            assert (data_dir / "served_url").read_text() == before
        finally:
            serve.kill_everything()


def test_the_launcher_stops_everything_when_its_valkey_dies(data_dir: Path) -> None:
    serve = _serve(data_dir)
    try:
        serve.wait_ready()
        valkey = _valkey(data_dir)
        valkey.kill()
        assert serve.process.wait(timeout=WAIT_SECONDS) == 1, serve.output
        assert f"The embedded Valkey (pid {valkey.pid}) died unexpectedly" in serve.output
        psutil.wait_procs(serve.descendants, timeout=WAIT_SECONDS)
        assert all(gone(p) for p in serve.descendants)
        assert not embedded_servers_of(data_dir)
    finally:
        serve.kill_everything()


class _GoneTerminal(io.StringIO):
    """A stdout whose reader is gone: a closed terminal, or ``make run | head`` after head."""

    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")


def test_a_launcher_whose_terminal_is_gone_still_stops_everything(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Writing "Stopping: …" raised BrokenPipeError, which ended the launcher before it stopped
    its children and Valkey: Valkey was left running, its parent gone."""
    stopped: list[str] = []
    command = serve.Command(stdout=_GoneTerminal())
    command._force = False  # as _install_signal_handlers leaves it
    monkeypatch.setattr(serve, "STOP_TIMEOUT_SECONDS", 5.0)
    child = serve._Child("sleeper", [sys.executable, "-c", "import time; time.sleep(60)"])
    child.process = subprocess.Popen(child.argv, start_new_session=True)
    try:
        command._stop_children([child])
        stopped.append("children")
    finally:
        if child.process.poll() is None:
            child.process.kill()
    assert stopped == ["children"] and child.process.poll() is not None


def test_a_stop_reaches_a_just_started_beat_only_once_its_scheduler_is_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CI on 72fa9cd: a Ctrl-C right after the banner, on a first run. The stop waited for the
    beat's schedule file, but a new store's file is written when it is opened, before the
    scheduler is set up. Signalled then, Celery's stop handler made and closed a second
    scheduler and exited from inside the first, whose store the interpreter closed on its way
    out: "Exception ignored … LookupError: unknown encoding: Latin-1". Here the scheduler holds
    for 3 s with its store open (tests/slow_beat.py), and a ready file left by an earlier run is
    there; the launcher's stop must wait for this beat to say its scheduler is made."""
    monkeypatch.setattr(serve, "STOP_TIMEOUT_SECONDS", 20.0)
    record = tmp_path / "record"
    record.touch()
    child = serve.beat_child(sys.executable, tmp_path)
    child.argv += ["--scheduler", "tests.slow_beat:SlowScheduler"]
    assert child.ready_file is not None
    child.ready_file.touch()  # an earlier run's
    command = serve.Command()
    command._force = False  # as _install_signal_handlers leaves it
    env = command._child_env(8000, current_database_url(), os.environ["SWITCHBOARD_TEST_REDIS_URL"])
    env["SLOW_BEAT_RECORD"] = str(record)
    output = tmp_path / "output"
    with output.open("wb") as out:
        serve.start_child(child, env, output=out)
    assert child.process is not None
    try:
        deadline = time.monotonic() + WAIT_SECONDS
        while "opened" not in record.read_text():  # the store's file is written; not yet set up
            assert child.process.poll() is None, output.read_text()
            assert time.monotonic() < deadline, "the beat never opened its store"
            time.sleep(0.05)
        command._stop_children([child])
    finally:
        if child.process.poll() is None:
            child.process.kill()
    said = output.read_text()
    assert child.process.returncode == 0, said
    # One store, opened and closed by the beat (its stop handler and its own exit both close
    # it): no second scheduler made by the stop handler.
    events = record.read_text().split()
    assert events.count("opened") == 1 and events[-1] == "closed", (events, said)
    assert "Traceback" not in said and "Exception ignored" not in said, said
    assert "beat: Starting..." in said, said


def _run_still_going(database: str) -> bool:
    """Whether the test process whose pid names ``database`` (``sb_serve_named_<pid>``) is
    another process still running. This process's own is dropped: it is a leftover."""
    pid = database.removeprefix("sb_serve_named_")
    return pid.isdigit() and int(pid) != os.getpid() and psutil.pid_exists(int(pid))


def test_a_database_left_by_a_run_still_going_is_not_dropped() -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    assert _run_still_going(f"sb_serve_named_{os.getppid()}")  # a process still running
    assert not _run_still_going(f"sb_serve_named_{os.getpid()}")  # this run's own leftover
    assert not _run_still_going(f"sb_serve_named_{dead.pid}")
    assert not _run_still_going("sb_serve_named_x")


@pytest.fixture
def named_servers(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """A database of its own on the test run's PostgreSQL, and a Valkey database of its own on
    the run's Valkey: (database URL, Redis URL)."""
    s = connection.settings_dict
    name = f"sb_serve_named_{os.getpid()}"
    conninfo = psycopg.conninfo.make_conninfo(
        host=str(s["HOST"]), port=str(s["PORT"]), user=s["USER"], password=s.get("PASSWORD") or ""
    )
    with psycopg.connect(conninfo, dbname=s["NAME"], autocommit=True) as admin:
        admin.execute("SET statement_timeout = '30s'")
        for (left,) in admin.execute(
            "SELECT datname FROM pg_database WHERE starts_with(datname, 'sb_serve_named_')"
        ).fetchall():
            if _run_still_going(left):
                continue  # another test run's, on the same PostgreSQL
            with contextlib.suppress(psycopg.errors.QueryCanceled):
                admin.execute(f'DROP DATABASE IF EXISTS "{left}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')
    # A database number of its own, eight below the test run's (a given REDIS_URL is shared by
    # the xdist workers, which take 15, 14, … : tests/conftest.py).
    base, number = os.environ["SWITCHBOARD_TEST_REDIS_URL"].rsplit("/", 1)
    redis_url = f"{base}/{int(number) - 8}"
    try:
        yield urlsplit(current_database_url())._replace(path=f"/{name}").geturl(), redis_url
    finally:
        redis.Redis.from_url(redis_url).flushdb()
        with psycopg.connect(conninfo, dbname=s["NAME"], autocommit=True) as admin:
            # A DROP DATABASE waits for every backend of the cluster to take its barrier: one
            # blocked writing to a client that stopped reading would hold the run for ever. A
            # database left behind (named by this run's pid) is dropped by the next run once
            # this process has ended (_run_still_going).
            admin.execute("SET statement_timeout = '30s'")
            with contextlib.suppress(psycopg.errors.QueryCanceled):
                admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_servers_named_in_files_are_used_and_none_is_embedded(
    tmp_path: Path, named_servers: tuple[str, str]
) -> None:
    # DATABASE_URL_FILE and REDIS_URL_FILE name the servers as DATABASE_URL and REDIS_URL do
    # (README, Configuration). The launcher read only the plain variables: it started the
    # embedded PostgreSQL and Valkey beside the servers its children were told of.
    database_url, redis_url = named_servers
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "database_url").write_text(database_url + "\n")
    (secrets / "redis_url").write_text(redis_url + "\n")
    data = Path(tempfile.mkdtemp(prefix="sb-named-")).resolve() / "data"
    port = web_port()
    env = console_env(
        data,
        DATABASE_URL_FILE=str(secrets / "database_url"),
        REDIS_URL_FILE=str(secrets / "redis_url"),
        # The beat's first tick comes one interval after it starts: 30 s at the default, 3 here.
        SWEEP_INTERVAL_SECONDS="3",
    )
    serve = Console([sys.executable, "manage.py", "serve", "--port", str(port)], data, port, env)
    try:
        serve.wait_ready()
        assert embedded_servers_of(data) == []
        assert not (data / "pg").exists() and not (data / "valkey").exists()
        # The demo data went to the database named, through the children as well.
        with psycopg.connect(database_url) as conn:
            users = conn.execute("SELECT count(*) FROM auth_user").fetchone()
        assert users is not None and users[0] > 0
        assert redis.Redis.from_url(redis_url).dbsize() > 0  # the beat's and workers' broker
        # Stopped once the beat has started (its first tick): a beat signalled while it still
        # imports its scheduler prints Celery's traceback (a known limit of an early Ctrl-C,
        # not what this test is about; ci106 stopped it 0.1 s after "beat: Starting...").
        deadline = time.monotonic() + 60
        while "Sending due task" not in serve.output:
            assert time.monotonic() < deadline, "the beat never ticked:\n" + serve.output
            time.sleep(0.2)
        assert serve.stop() == 0, serve.output
        assert "Traceback" not in serve.output, serve.output
    finally:
        serve.kill_everything()
        shutil.rmtree(data.parent, ignore_errors=True)
