"""``manage.py serve``: the launcher behind ``make run``.

It prepares the embedded services when the environment does not name real ones, migrates, seeds
the demo data on first run, then runs four children and watches them:

* uvicorn serving ``switchboard.asgi:application`` on HOST:PORT,
* one Celery worker for the sweeps (the ``celery`` queue) and one for the ready hooks (``hooks``),
* one Celery beat (the sweep schedule, kept in ``<data>/celerybeat-schedule``).

One launcher runs per data folder (it holds ``<data>/serve.lock``; a second one is refused,
naming the first one's pid and URL). Once the web server answers it records the address in
``<data>/served_url``, so the URL every process tells agents (``endpoint vend``, the API's vend,
the demo banner) reaches it, unless ``SWITCHBOARD_PUBLIC_URL`` says otherwise; and it prints the
bearer token of ``/metrics`` (on a local start generated once into ``<data>/metrics_token``).

The children get ``DATABASE_URL`` and ``REDIS_URL`` explicitly, so they never start or attach to
the embedded machinery themselves. Each runs in its own process group: Ctrl-C in a terminal reaches
only this launcher, which then stops the children in order (SIGTERM, up to ten seconds, then
SIGKILL to the whole group), then stops the Valkey it started (or adopted from a launcher that was
killed) and drops its PostgreSQL handle; both embedded servers run in sessions of their own, so
Ctrl-C does not stop them under the children. If a child or an embedded server dies on its own,
the launcher stops the rest and exits non-zero, naming it.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import http.client
import io
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO, Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError, CommandParser

from switchboard import embedded, webserver
from switchboard.celery import BEAT_READY_FILE_ENV
from switchboard.core.cli import SwitchboardCommand, integer

STOP_TIMEOUT_SECONDS = 10.0
BEAT_SETTLE_SECONDS = 20.0  # at most, a just-started beat's wait to set its scheduler up
READY_TIMEOUT_SECONDS = 60.0
POLL_SECONDS = 0.2
FIRST_RUN_MARKER = "Demo login:"


class _Interrupted(Exception):
    """A second stop signal arrived while the launcher was still starting up."""


@dataclass
class _Child:
    name: str
    argv: list[str]
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    started_at: float = 0.0  # time.monotonic() when started
    # A beat's: the file it writes once its scheduler is made (switchboard.celery), removed
    # before it starts. None for the other children.
    ready_file: Path | None = None

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid


def beat_child(python: str, data_dir: Path) -> _Child:
    """The Celery beat, its schedule kept in ``<data>/celerybeat-schedule``."""
    return _Child(
        "celery beat",
        [
            python, "-m", "celery", "-A", "switchboard", "--quiet", "beat",
            "--loglevel", "INFO", "--schedule", str(data_dir / "celerybeat-schedule"),
        ],
        ready_file=data_dir / "beat-ready",
    )  # fmt: skip


def start_child(child: _Child, env: dict[str, str], output: IO[bytes] | None = None) -> None:
    """Start ``child`` with ``env`` and the launcher's output (or ``output``)."""
    if child.ready_file is not None:
        child.ready_file.unlink(missing_ok=True)  # a beat's from an earlier run
        env = {**env, BEAT_READY_FILE_ENV: str(child.ready_file)}
    child.process = subprocess.Popen(
        child.argv,
        env=env,
        cwd=str(settings.BASE_DIR),
        stdin=subprocess.DEVNULL,
        stdout=output,
        stderr=None if output is None else subprocess.STDOUT,
        # Its own process group: a terminal's Ctrl-C reaches only this launcher, and a stuck
        # child can be killed together with everything it started.
        process_group=0,
        preexec_fn=_die_with_parent(),
    )
    child.started_at = time.monotonic()


def _beat_set_up(child: _Child) -> bool:
    """Whether the beat ``child`` has made its scheduler (its store open and set up, and its
    own stop handler in place of Celery's: switchboard.celery.stop_between_ticks), which it says
    by writing its ready file (Celery's ``beat_init``).
    Not the schedule file's time: a new store's file is written when it is opened, before the
    scheduler is set up (CI on 72fa9cd: a stop in between left the store to the interpreter's
    exit, which printed a traceback)."""
    return child.ready_file is not None and child.ready_file.exists()


class Command(SwitchboardCommand):
    help = (
        "Run Switchboard: embedded PostgreSQL and Valkey unless DATABASE_URL / REDIS_URL are set, "
        "migrations, demo data on first run, then the web server, two Celery workers (sweeps, hooks) "
        "and one beat."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--port",
            type=integer,
            default=None,
            help="Port for the web server (default: SWITCHBOARD_PORT, else 8000).",
        )
        parser.add_argument(
            "--host", default="127.0.0.1", help="Address to bind (default: 127.0.0.1)."
        )

    # -- signals -------------------------------------------------------------------------------

    def _install_signal_handlers(self) -> dict[int, Any]:
        self._stop_signal: int | None = None
        self._shutting_down = False
        self._force = False
        previous: dict[int, Any] = {}
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            previous[signum] = signal.signal(signum, self._on_signal)
        return previous

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self._shutting_down:
            # A second Ctrl-C while stopping: do not wait for the children any longer.
            self._force = True
            return
        if self._stop_signal is not None:
            # A second signal during startup (migrate or seeding stuck): give up at once.
            raise _Interrupted
        self._stop_signal = signum

    # -- main ----------------------------------------------------------------------------------

    def handle(self, *args: Any, **options: Any) -> None:
        host: str = options["host"]
        port: int = options["port"] or settings.PORT
        served_url = _served_url(host, port)
        # One launcher per data folder: a second would run a second beat and more workers on
        # the same database and broker, and record its own address over the first one's.
        lock = _lock_data_dir(served_url)
        if "SWITCHBOARD_PUBLIC_URL" not in settings.GIVEN_IN_ENVIRONMENT:
            settings.PUBLIC_URL = served_url
        previous_handlers = self._install_signal_handlers()
        children: list[_Child] = []
        valkey: embedded.EmbeddedValkey | None = None
        failure: str | None = None
        try:
            # Given in the environment (or a _FILE), else embedded in the data folder.
            database_url = settings.GIVEN_DATABASE_URL or embedded.ensure_postgres().url()
            postgres_pid = None if settings.GIVEN_DATABASE_URL else embedded.postgres_pid()
            redis_url = settings.GIVEN_REDIS_URL
            if not redis_url:
                redis_url = embedded.embedded_redis_url()
                valkey = self._embedded_valkey(redis_url)
            if self._stop_signal is None:
                call_command("migrate", interactive=False, verbosity=1)
            first_run_text = ""
            if self._stop_signal is None:
                first_run_text = self._seed()
            watch = _Watched(valkey, postgres_pid)
            if self._stop_signal is None:
                children = self._start_children(host, port, database_url, redis_url)
            if self._stop_signal is None:
                failure = self._wait_until_ready(children, watch, host, port)
            if self._stop_signal is None and failure is None:
                # Only now: the URL every process tells agents is one that answers.
                embedded.record_served_url(served_url)
                self._banner(host, port, first_run_text)
                failure = self._supervise(children, watch)
        except _Interrupted:
            pass
        finally:
            self._shutting_down = True
            # The children first: they still flush counters to Valkey and leave the broker.
            self._stop_children(children)
            if valkey is not None:
                with contextlib.suppress(Exception):
                    valkey.stop()
            embedded.stop_postgres()
            for signum, handler in previous_handlers.items():
                signal.signal(signum, handler)
            lock.close()
        if failure is not None:
            raise CommandError(failure, returncode=1)
        self._say("Switchboard stopped.")

    def _embedded_valkey(self, redis_url: str) -> embedded.EmbeddedValkey | None:
        """Start this data folder's Valkey, or adopt the one a killed launcher left running;
        None when something else answers on its port (it is then neither watched nor stopped)."""
        if not embedded.valkey_running(redis_url):
            valkey = embedded.start_valkey(redis_url)
            self._say(f"Valkey: started at {redis_url} (data in {embedded.data_dir()})")
            return valkey
        adopted = embedded.adopt_valkey(redis_url)
        if adopted is not None:
            self._say(
                f"Valkey: adopted the server a stopped launcher left running at {redis_url} "
                f"(pid {adopted.pid}); it stops with this one"
            )
        else:
            self._say(f"Valkey: reusing the server already listening at {redis_url}")
        return adopted

    # -- steps ---------------------------------------------------------------------------------

    def _seed(self) -> str:
        """Run seed_demo; return its output when it seeded (first run), else ""."""
        buffer = io.StringIO()
        call_command("seed_demo", stdout=buffer)
        text = buffer.getvalue()
        if text:
            # Shown at once too: tokens are printed only once, and a child could still fail.
            self.stdout.write(text, ending="")
            self._flush()
        return text if FIRST_RUN_MARKER in text else ""

    def _child_env(self, port: int, database_url: str, redis_url: str) -> dict[str, str]:
        env = dict(os.environ)
        env["DATABASE_URL"] = database_url
        env["REDIS_URL"] = redis_url
        env["SWITCHBOARD_PORT"] = str(port)
        env["SWITCHBOARD_DATA_DIR"] = str(embedded.data_dir())
        env["DJANGO_SETTINGS_MODULE"] = os.environ.get(
            "DJANGO_SETTINGS_MODULE", "switchboard.settings"
        )
        env["PYTHONUNBUFFERED"] = "1"
        # served_url is recorded only once the web server answers: the children are told now.
        env["SWITCHBOARD_PUBLIC_URL"] = settings.PUBLIC_URL
        if settings.METRICS_TOKEN and not (
            env.get("METRICS_TOKEN") or env.get("METRICS_TOKEN_FILE")
        ):
            # The token generated into the data folder. The children are told DATABASE_URL and
            # REDIS_URL, so by themselves they would take this for production and generate none.
            env["METRICS_TOKEN_FILE"] = str(embedded.dev_secret_file("metrics_token"))
        return env

    def _start_children(
        self, host: str, port: int, database_url: str, redis_url: str
    ) -> list[_Child]:
        python = sys.executable
        children = [
            _Child("web (uvicorn)", web_command(host, port)),
            _Child(
                "celery worker",
                [
                    python, "-m", "celery", "-A", "switchboard", "--quiet", "worker",
                    "--loglevel", "INFO", "--concurrency", "2", "-Q", "celery", "-n", "sweeps@%h",
                ],
            ),
            # Ready hooks on a worker of their own: a slow receiver never delays the sweeps.
            _Child(
                "hooks worker",
                [
                    python, "-m", "celery", "-A", "switchboard", "--quiet", "worker",
                    "--loglevel", "INFO", "--concurrency", "2", "-Q", "hooks", "-n", "hooks@%h",
                ],
            ),
            beat_child(python, embedded.data_dir()),
        ]  # fmt: skip
        env = self._child_env(port, database_url, redis_url)
        started: list[_Child] = []
        for child in children:
            start_child(child, env)
            started.append(child)
            if self._stop_signal is not None:
                break
        return started

    def _wait_until_ready(
        self, children: list[_Child], watch: _Watched, host: str, port: int
    ) -> str | None:
        """Poll until the web server answers HTTP. Returns a failure message, or None."""
        probe_host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        while self._stop_signal is None:
            dead = self._first_dead(children) or watch.first_dead()
            if dead is not None:
                return dead
            if _answers_http(probe_host, port):
                return None
            if time.monotonic() > deadline:
                return (
                    f"The web server did not answer on http://{host}:{port}/ within "
                    f"{READY_TIMEOUT_SECONDS:.0f} s; stopped everything."
                )
            time.sleep(POLL_SECONDS)
        return None

    def _supervise(self, children: list[_Child], watch: _Watched) -> str | None:
        while self._stop_signal is None:
            dead = self._first_dead(children) or watch.first_dead()
            if dead is not None:
                return dead
            time.sleep(POLL_SECONDS)
        return None

    @staticmethod
    def _first_dead(children: list[_Child]) -> str | None:
        for child in children:
            assert child.process is not None
            code = child.process.poll()
            if code is not None:
                how = f"signal {-code}" if code < 0 else f"exit code {code}"
                return f"The {child.name} child died unexpectedly ({how}); stopped the rest."
        return None

    def _stop_children(self, children: list[_Child]) -> None:
        running = [c for c in children if c.process is not None and c.process.poll() is None]
        if running:
            self._say("Stopping: " + ", ".join(c.name for c in running) + " ...")
        # A beat signalled before its scheduler is made prints a traceback: Celery's stop handler
        # makes a second scheduler (while the first still imports: a circular import, ci106,
        # ci107) and exits from inside the first, whose store is left open (CI on 72fa9cd). A
        # beat that has not said it is set up is signalled last, once it has, or after
        # BEAT_SETTLE_SECONDS, or at once if the stop is forced.
        young = [c for c in running if c.ready_file is not None and not _beat_set_up(c)]
        for child in [c for c in running if c not in young]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.pid, signal.SIGTERM)
        for child in young:
            settle = child.started_at + BEAT_SETTLE_SECONDS
            while not (_beat_set_up(child) or self._force or time.monotonic() > settle):
                time.sleep(0.1)
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_SECONDS
        while any(c.process.poll() is None for c in running if c.process is not None):
            if self._force or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        for child in children:
            assert child.process is not None
            if child.process.poll() is None:
                self._say(f"{child.name} did not stop in time; killing it.")
            # Kill the whole group: it also takes anything the child left behind (pool workers).
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(child.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.process.wait(timeout=5)

    # -- output --------------------------------------------------------------------------------

    def _banner(self, host: str, port: int, first_run_text: str) -> None:
        base = f"http://{host}:{port}/"
        lines = ["", "=" * 72, f"Switchboard is running at {base}", f"  Admin:  {base}admin/"]
        if first_run_text:
            lines.append("")
            lines.extend(
                "  " + line
                for line in first_run_text.splitlines()
                if line.strip() and set(line.strip()) != {"="}
            )
            lines.append("  (Shown once: the tokens above are stored only as hashes.)")
        else:
            lines.append(
                "  Login:  the demo credentials were printed on the first run. For a new login:"
            )
            lines.append("          .venv/bin/python manage.py createsuperuser")
        lines.extend(_metrics_lines(base))
        lines.append(f"  Data:   {embedded.data_dir()}")
        lines.append("  Stop:   Ctrl-C")
        lines.append("=" * 72)
        self.stdout.write("\n".join(lines))
        self._flush()

    def _say(self, text: str) -> None:
        """Tell the terminal, if it is still there: a terminal closed (or the reader of
        ``make run | …`` gone) must not stop the stop half-way (a BrokenPipeError here ended the
        launcher before it stopped Valkey)."""
        try:
            self.stdout.write(f"serve: {text}")
            self._flush()
        except OSError:
            pass

    def _flush(self) -> None:
        self.stdout.flush()
        sys.stdout.flush()


@dataclass
class _Watched:
    """The embedded servers the children need, watched as the children are: when one dies the
    launcher says so and stops everything (a restarted Valkey would have lost the broker's
    queued tasks since its last append, and a server that crashes once usually does again)."""

    valkey: embedded.EmbeddedValkey | None
    postgres_pid: int | None

    def first_dead(self) -> str | None:
        if self.valkey is not None and not self.valkey.alive():
            how = self.valkey.exit_description()
            return (
                f"The embedded Valkey (pid {self.valkey.pid}) died unexpectedly ({how}); "
                "stopped the rest."
            )
        if self.postgres_pid is not None and not embedded.postgres_running(self.postgres_pid):
            return (
                f"The embedded PostgreSQL (pid {self.postgres_pid}) died unexpectedly; "
                "stopped the rest."
            )
        return None


def _lock_data_dir(served_url: str) -> IO[str]:
    """Hold ``<data>/serve.lock`` for the launcher's life (the kernel drops it if the launcher
    is killed), with the holder's pid and URL in it; CommandError when another launcher holds it."""
    path = embedded.data_dir() / "serve.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = path.open("a+")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.seek(0)
        holder = lock.read().split()
        lock.close()
        pid, url = [*holder, "?", "?"][:2]
        raise CommandError(
            f"Another launcher (pid {pid}, serving {url}) is running on the data folder "
            f"{embedded.data_dir()}: stop it first, or give this one another "
            "SWITCHBOARD_DATA_DIR.",
            returncode=1,
        ) from None
    lock.seek(0)
    lock.truncate()
    lock.write(f"{os.getpid()} {served_url}\n")
    lock.flush()
    return lock


def web_command(host: str, port: int, app: str = "switchboard.asgi:application") -> list[str]:
    """The web child's command line."""
    return [
        sys.executable, "-m", "uvicorn", app, "--host", host, "--port", str(port),
        # The lifespan's shutdown sends the last counter increments (switchboard.asgi).
        "--lifespan", "on",
        "--http", webserver.PROTOCOL, "--loop", "uvloop",
        # Open event streams must not hold a shutdown past the stop timeout.
        "--timeout-graceful-shutdown", str(webserver.STREAM_GRACE_SECONDS),
    ]  # fmt: skip


def _served_url(host: str, port: int) -> str:
    """The base URL a client on this machine reaches the web server at."""
    host = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(host, host)
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}"


def _metrics_lines(base: str) -> list[str]:
    """Where Prometheus scrapes, and with which bearer token (the README's scrape config)."""
    lines = [f"  Metrics: {base}metrics"]
    if not settings.METRICS_TOKEN:
        lines.append("          off: METRICS_TOKEN is unset")
    elif os.environ.get("METRICS_TOKEN") or os.environ.get("METRICS_TOKEN_FILE"):
        lines.append("          bearer token: the one METRICS_TOKEN names")
    else:
        path = embedded.dev_secret_file("metrics_token")
        lines.append(f"          bearer token: {settings.METRICS_TOKEN}")
        lines.append(f"          (kept in {path})")
    return lines


def _die_with_parent() -> Callable[[], None] | None:
    """On Linux, have each child receive SIGTERM if the launcher itself is killed (kill -9, OOM),
    so no web server or worker outlives it holding the port. The embedded PostgreSQL and Valkey
    may outlive it; the next ``serve`` reattaches to them."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig = 1

    def set_parent_death_signal() -> None:
        prctl(pr_set_pdeathsig, int(signal.SIGTERM), 0, 0, 0)

    return set_parent_death_signal


def _answers_http(host: str, port: int) -> bool:
    connection = http.client.HTTPConnection(host, port, timeout=2)
    try:
        connection.request("GET", "/admin/login/", headers={"Host": f"127.0.0.1:{port}"})
        connection.getresponse().read()
        return True
    except (OSError, http.client.HTTPException):
        return False
    finally:
        connection.close()
