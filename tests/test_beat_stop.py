"""A stop signal, wherever it finds the beat (switchboard/celery.py: SweepScheduler,
stop_between_ticks). The beat is the one `manage.py serve` starts (``serve.beat_child``), on a
Valkey of the test's own that the test freezes to hold the beat inside a send."""

from __future__ import annotations

import shelve
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery

from queues.management.commands import serve
from switchboard.celery import SweepScheduler
from switchboard.embedded import free_port
from tests.valkey import Valkey

WAIT_SECONDS = 60.0
SIGTERM_BIT = 1 << (signal.SIGTERM - 1)


@pytest.fixture
def valkey(tmp_path: Path) -> Iterator[Valkey]:
    (tmp_path / "valkey").mkdir()
    server = Valkey(tmp_path / "valkey")
    server.start()
    try:
        yield server
    finally:
        server.stop()  # thaws it first


def start_beat(tmp_path: Path, redis_url: str, sweep_seconds: int) -> tuple[serve._Child, Path]:
    """The launcher's beat, with its own output file; returned once it says its scheduler is
    made (its ready file)."""
    child = serve.beat_child(sys.executable, tmp_path)
    env = serve.Command()._child_env(8000, "postgresql://unused@127.0.0.1:1/unused", redis_url)
    env["SWEEP_INTERVAL_SECONDS"] = str(sweep_seconds)
    output = tmp_path / "beat-output"
    with output.open("wb") as out:
        serve.start_child(child, env, output=out)
    assert child.process is not None and child.ready_file is not None
    deadline = time.monotonic() + WAIT_SECONDS
    while not child.ready_file.exists():
        assert child.process.poll() is None, output.read_text()
        assert time.monotonic() < deadline, "the beat never set its scheduler up"
        time.sleep(0.05)
    return child, output


def wait_for(what: str, done: Callable[[], bool], output: Path) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while not done():
        assert time.monotonic() < deadline, f"{what}:\n{output.read_text()}"
        time.sleep(0.02)


def unread_request_bytes(port: int) -> int:
    """Bytes sent to 127.0.0.1:``port`` that its server has not read (/proc/net/tcp)."""
    unread = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, state, queues = fields[1], fields[3], fields[4]
        if local == f"0100007F:{port:04X}" and state == "01":  # ESTABLISHED, the server's side
            unread += int(queues.split(":")[1], 16)
    return unread


def asleep(pid: int) -> bool:
    """Whether ``pid``'s main thread sleeps (``time.sleep``: the beat between ticks)."""
    return Path(f"/proc/{pid}/wchan").read_text() == "hrtimer_nanosleep"


def signal_delivered(pid: int, signum_bit: int) -> bool:
    """Whether no signal of ``signum_bit`` waits for ``pid`` (its handler has been entered)."""
    status = dict(
        line.split(":\t", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    return not any(int(status[key], 16) & signum_bit for key in ("SigPnd", "ShdPnd"))


def assert_stopped_clean(
    child: serve._Child, output: Path, schedule: Path, *, errors_logged: bool = False
) -> None:
    assert child.process is not None
    try:
        code = child.process.wait(timeout=serve.STOP_TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired:
        child.process.kill()
        raise AssertionError(
            f"the beat did not stop within the launcher's {serve.STOP_TIMEOUT_SECONDS} s "
            f"(after which it kills it):\n{output.read_text()}"
        ) from None
    said = output.read_text()
    assert code == 0, said
    signs = ["Traceback", "Exception ignored", "CRITICAL"] + ([] if errors_logged else ["ERROR"])
    for sign in signs:
        assert sign not in said, said
    # The store was saved and closed: it opens, with every sweep in it.
    with shelve.open(str(schedule), flag="r") as store:
        assert set(store["entries"]) >= {"reap-expired", "admission-reopen"}, dict(store)


def test_a_beat_signalled_while_it_waits_on_valkey_sends_the_task_and_exits_clean(
    tmp_path: Path, valkey: Valkey
) -> None:
    """CI on 4ed98fa. Celery's stop handler closed the broker connection and the store from
    inside the signal handler. Signalled while it waited on Valkey for a task it was sending,
    the beat met its own closed connection ("I/O operation on closed file"), which took the
    stop's place; it logged that, ticked on with its store closed and died of it ("invalid
    operation on closed shelf"). Here the beat sends its first tasks, and once it sleeps
    between ticks (nothing asked of Valkey then), Valkey is frozen: the beat's next send waits
    for Valkey's answer, and is signalled while it waits. Then Valkey is thawed."""
    child, output = start_beat(tmp_path, valkey.url, sweep_seconds=1)
    assert child.process is not None
    try:
        wait_for("the beat never sent", lambda: "Sending due task" in output.read_text(), output)
        deadline = time.monotonic() + WAIT_SECONDS
        while True:  # frozen while the beat sleeps, so no request of its is half answered
            wait_for("the beat never slept", lambda: asleep(child.pid), output)
            valkey.signal(signal.SIGSTOP)
            sent_before = output.read_text().count("Sending due task")
            if asleep(child.pid):  # still: nothing sent since the count, nothing in flight
                break
            valkey.signal(signal.SIGCONT)
            assert time.monotonic() < deadline, "never frozen while the beat slept"
        wait_for("nothing reached Valkey", lambda: unread_request_bytes(valkey.port) > 0, output)
        child.process.send_signal(signal.SIGTERM)
        wait_for(
            "the SIGTERM stayed pending",
            lambda: signal_delivered(child.pid, SIGTERM_BIT),
            output,
        )
        assert child.process.poll() is None, output.read_text()  # still waiting on Valkey
        valkey.signal(signal.SIGCONT)
        assert_stopped_clean(child, output, tmp_path / "celerybeat-schedule")
    finally:
        if child.process.poll() is None:
            child.process.kill()
    # The task it was sending when signalled was sent, and none after it; every task the beat
    # said it sent is in the queue.
    sent = output.read_text().count("Sending due task")
    assert sent == sent_before + 1, output.read_text()
    assert redis.Redis.from_url(valkey.url).llen("celery") == sent


def test_a_beat_signalled_between_ticks_stops_at_once(tmp_path: Path, valkey: Valkey) -> None:
    """Asleep until its next tick (30 s away), the beat stops on the signal, not on waking."""
    child, output = start_beat(tmp_path, valkey.url, sweep_seconds=30)
    assert child.process is not None
    try:
        wait_for("the beat never slept", lambda: asleep(child.pid), output)
        child.process.send_signal(signal.SIGTERM)
        assert_stopped_clean(child, output, tmp_path / "celerybeat-schedule")
    finally:
        if child.process.poll() is None:
            child.process.kill()
    assert redis.Redis.from_url(valkey.url).llen("celery") == 0  # nothing was due


def test_a_beat_signalled_while_it_retries_a_broker_that_is_down_stops_at_once(
    tmp_path: Path,
) -> None:
    """Nothing listens where the broker should be: the beat's first tick tries again and again
    (kombu's backoff: 2, 4, 6 … s, up to a hundred tries). It stops on the signal, between two
    tries, not when the tries run out."""
    child, output = start_beat(tmp_path, f"redis://127.0.0.1:{free_port()}/0", sweep_seconds=1)
    assert child.process is not None
    try:
        wait_for(
            "the beat never tried again",
            lambda: "beat: Connection error" in output.read_text(),
            output,
        )
        child.process.send_signal(signal.SIGTERM)
        assert_stopped_clean(child, output, tmp_path / "celerybeat-schedule", errors_logged=True)
    finally:
        if child.process.poll() is None:
            child.process.kill()
    assert "Sending due task" not in output.read_text()


def test_a_stop_asked_during_a_tick_ends_the_beat_before_it_sleeps(tmp_path: Path) -> None:
    """The tick that was under way when the stop came sends what it was sending, then ends the
    beat rather than sleep until the next tick is due (30 s here; the launcher kills after 10)."""
    app = Celery("beat-stop", broker="memory://", set_as_current=False)
    app.conf.beat_schedule = {"sweep": {"task": "beat_stop.sweep", "schedule": 30.0}}
    app.conf.broker_connection_retry_on_startup = True

    class StoppedWhileSending(SweepScheduler):
        def send_task(self, *args: Any, **kwargs: Any) -> Any:
            self.stop_requested = True  # as stop_between_ticks's handler, mid-send
            return super().send_task(*args, **kwargs)

    scheduler = StoppedWhileSending(app=app, schedule_filename=str(tmp_path / "schedule"))
    try:
        scheduler.schedule["sweep"].last_run_at -= timedelta(minutes=1)  # due now, next in 30 s
        with pytest.raises(SystemExit):
            scheduler.tick()
    finally:
        scheduler.close()
    with app.connection_for_read() as connection:
        assert connection.SimpleQueue("celery").qsize() == 1
