"""A web process keeps agents' endpoint rows (queues/auth.py, at most ENDPOINT_CACHE_SECONDS), so
an agent request skips the token lookup; a revoke still refuses the very next request everywhere:
at once in the process that saved it, and in every other through the change a trigger announces
(migration 0012), whoever made it. While a process cannot listen, it looks every token up."""

from __future__ import annotations

import time
from typing import Any

import httpx
import psycopg
import pytest
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connection
from django.db.models.signals import post_init
from django.test import Client, override_settings

from queues import services
from queues.auth import (
    _ENDPOINT_ATTNAMES,
    _ENDPOINT_FIELDS,
    WATCH_APPLICATION_NAME,
    _endpoint_row,
    endpoint_cache,
    endpoint_for_token,
    endpoint_from_row,
    endpoint_watch,
)
from queues.models import Endpoint, EndpointState
from switchboard.core import availability
from switchboard.core.tokens import hash_token
from switchboard.liveserver import live_server
from tests.api.conftest import Api
from tests.conftest import FIXTURE, Personas, database_url, push

CACHED = override_settings(ENDPOINT_CACHE_SECONDS=1.0)


@CACHED
def test_a_revoke_refuses_the_very_next_request_in_the_same_process(
    personas: Personas, client: Client
) -> None:
    agent = Api(client, personas.agent_token)
    assert agent.verb("claim_next", {}).status_code == 200  # the row is now cached
    services.endpoint_revoke(actor=FIXTURE, endpoint=personas.agent)
    refused = agent.verb("claim_next", {})
    assert (refused.status_code, refused.json()["code"]) == (401, "unauthorized")


@CACHED
def test_the_cache_hands_each_request_an_endpoint_of_its_own(personas: Personas) -> None:
    first = endpoint_for_token(personas.agent_token)
    assert first is not None
    first.scope_queues.append("elsewhere")
    first.state = EndpointState.REVOKED
    second = endpoint_for_token(personas.agent_token)
    assert second is not None and second.state == EndpointState.ACTIVE
    assert "elsewhere" not in second.scope_queues


@CACHED
def test_the_cache_serves_a_row_without_asking_the_database_again(personas: Personas) -> None:
    endpoint_cache.clear()
    assert endpoint_for_token(personas.agent_token) is not None
    with connection.cursor() as cursor:  # behind the services' back: no signal, no clearing
        cursor.execute(
            "UPDATE queues_endpoint SET state = 'revoked', revoked_at = now() WHERE id = %s",
            [personas.agent.id],
        )
    assert endpoint_for_token(personas.agent_token) is not None
    endpoint_cache.clear()
    assert endpoint_for_token(personas.agent_token) is None


def test_a_revoke_made_by_another_process_takes_effect_within_the_ttl(
    tx_personas: Personas,
) -> None:
    push(tx_personas, 1)
    auth = {"Authorization": f"Bearer {tx_personas.agent_token}"}
    ttl = 1.0
    with live_server(database_url(), env={"ENDPOINT_CACHE_SECONDS": str(ttl)}) as base:
        url = f"{base}/api/v1/agent/claim_next"
        assert httpx.post(url, headers=auth, json={}, timeout=30).status_code == 200
        services.endpoint_revoke(
            actor=FIXTURE, endpoint=tx_personas.agent
        )  # in this process, not the server's
        time.sleep(ttl)
        refused = httpx.post(url, headers=auth, json={}, timeout=30)
        assert (refused.status_code, refused.json()["code"]) == (401, "unauthorized")


def test_by_default_a_revoke_made_by_another_process_refuses_its_next_request(
    tx_personas: Personas,
) -> None:
    assert settings.ENDPOINT_CACHE_SECONDS >= 60  # the cache is on
    push(tx_personas, 1)
    auth = {"Authorization": f"Bearer {tx_personas.agent_token}"}
    with live_server(database_url()) as base:
        url = f"{base}/api/v1/agent/claim_next"
        for _ in range(3):  # the row is cached after the first
            assert httpx.post(url, headers=auth, json={}, timeout=30).status_code == 200
        services.endpoint_revoke(actor=FIXTURE, endpoint=tx_personas.agent)
        refused = httpx.post(url, headers=auth, json={}, timeout=30)
        assert (refused.status_code, refused.json()["code"]) == (401, "unauthorized")


def test_a_revoke_in_plain_sql_refuses_the_next_request_of_a_server_that_cached_the_row(
    tx_personas: Personas,
) -> None:
    """No service, no signal: only the trigger's announcement can reach the server's cache."""
    auth = {"Authorization": f"Bearer {tx_personas.agent_token}"}
    with live_server(database_url()) as base:
        url = f"{base}/api/v1/agent/claim_next"
        for _ in range(3):
            assert httpx.post(url, headers=auth, json={}, timeout=30).status_code == 200
        with connection.cursor() as cursor:  # autocommit: committed when it returns
            cursor.execute(
                "UPDATE queues_endpoint SET state = 'revoked', revoked_at = now() WHERE id = %s",
                [tx_personas.agent.id],
            )
        refused = httpx.post(url, headers=auth, json={}, timeout=30)
        assert (refused.status_code, refused.json()["code"]) == (401, "unauthorized")


def _watchers() -> set[int]:
    """The backends of the endpoint watches listening on the test database (one per web
    process)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND application_name = %s",
            [WATCH_APPLICATION_NAME],
        )
        return {pid for (pid,) in cursor.fetchall()}


def test_a_revoke_refuses_the_next_request_on_every_worker_process(tx_personas: Personas) -> None:
    """The README's production command with 2 workers: each caches the row (requests on new
    connections land on both), and after a revoke made in a third process none serves it."""
    endpoint_watch.close()  # this process's own, from an earlier test: not counted below
    # Another module's live server may still be up and listening (the MCP tests' session
    # server, when they ran first), or still stopping (its watch gone a moment later: ci123
    # counted it, then missed it): only backends that were not there before are this server's.
    others = _watchers()
    auth = {"Authorization": f"Bearer {tx_personas.agent_token}"}
    with live_server(database_url(), workers=2, server="gunicorn") as base:
        url = f"{base}/api/v1/agent/claim_next"
        for _ in range(60):  # a new connection each, until both workers listen (and cache)
            with httpx.Client() as fresh:
                assert fresh.post(url, headers=auth, json={}, timeout=30).status_code == 200
            if len(_watchers() - others) >= 2:
                break
        assert len(_watchers() - others) == 2, (others, _watchers())
        services.endpoint_revoke(actor=FIXTURE, endpoint=tx_personas.agent)
        for _ in range(12):
            with httpx.Client() as fresh:
                refused = fresh.post(url, headers=auth, json={}, timeout=30)
            assert (refused.status_code, refused.json()["code"]) == (401, "unauthorized")


def _watch_backend() -> int:
    """The PostgreSQL backend of this process's watch connection."""
    conn = endpoint_watch._conn
    assert conn is not None
    return conn.info.backend_pid


def test_a_change_committed_elsewhere_reaches_this_process_cache(tx_personas: Personas) -> None:
    token = tx_personas.agent_token
    assert endpoint_for_token(token) is not None
    assert endpoint_watch.ready()
    assert endpoint_cache.get(hash_token(token), 60) is not None  # cached
    with psycopg.connect(database_url(), autocommit=True) as other:  # another client's commits
        # Each lookup right after the commit's acknowledgement: no waiting for the notification
        # to come by (a watch that only read what had arrived lost this race now and then).
        for n in range(100):
            other.execute(
                "UPDATE queues_endpoint SET scope_queues = %s WHERE id = %s",
                [[f"moved-{n}"], tx_personas.agent.id],
            )
            endpoint = endpoint_for_token(token)
            assert endpoint is not None and endpoint.scope_queues == [f"moved-{n}"]


def test_a_statement_sent_after_a_request_arrived_answers_for_it(
    tx_personas: Personas, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Any empty statement sent after a request arrived answers for it, whoever sent it: the
    request waits for no round trip of its own. One that arrived after a change committed
    elsewhere still sees the change."""
    token = tx_personas.agent_token
    arrived = time.monotonic()
    assert endpoint_watch.ready(arrived)  # one sent since
    asked: list[int] = []
    ask = endpoint_watch._ask

    def counted(conn: Any) -> bool:
        asked.append(1)
        return ask(conn)

    monkeypatch.setattr(endpoint_watch, "_ask", counted)
    with availability.request_deadline(arrived):
        assert endpoint_for_token(token) is not None
        assert endpoint_for_token(token) is not None  # cached
    assert asked == []
    with psycopg.connect(database_url(), autocommit=True) as other:
        for n in range(50):
            other.execute(
                "UPDATE queues_endpoint SET scope_queues = %s WHERE id = %s",
                [[f"moved-{n}"], tx_personas.agent.id],
            )
            with availability.request_deadline(time.monotonic()):  # arrived after the commit
                endpoint = endpoint_for_token(token)
            assert endpoint is not None and endpoint.scope_queues == [f"moved-{n}"]
    assert len(asked) == 50  # each arrived after the last statement was sent: one each


def test_a_process_no_agent_asks_still_reads_its_notifications(
    tx_personas: Personas, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only requests read the watch's notifications: in a process serving no agent they filled
    the socket, and the listening backend blocked writing to it, which holds PostgreSQL's NOTIFY
    queue (every channel's) from being trimmed and stalled a DROP DATABASE for ever. A thread
    of the process now reads them when no request has for a while."""
    monkeypatch.setattr(endpoint_watch, "DRAIN_EVERY", 0.2)
    token = tx_personas.agent_token
    assert endpoint_for_token(token) is not None
    digest = hash_token(token)
    assert endpoint_cache.get(digest, 60) is not None  # cached, and the watch is up
    with psycopg.connect(database_url(), autocommit=True) as other:
        other.execute(
            "UPDATE queues_endpoint SET name = name || '.' WHERE id = %s", [tx_personas.agent.id]
        )
    deadline = time.monotonic() + 10  # the drain thread may be in a sleep begun before
    while endpoint_cache.get(digest, 60) is not None:  # no request asks meanwhile
        assert time.monotonic() < deadline, "nothing read the notification"
        time.sleep(0.05)


def test_a_watch_that_lost_its_connection_fails_closed(tx_personas: Personas) -> None:
    """The watch's backend is killed, then the row revoked: nobody announces it to this process,
    which must then ask the database, not its cache."""
    token = tx_personas.agent_token
    assert endpoint_for_token(token) is not None
    assert endpoint_watch.ready()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s, 5000)", [_watch_backend()])
        cursor.execute(
            "UPDATE queues_endpoint SET state = 'revoked', revoked_at = now() WHERE id = %s",
            [tx_personas.agent.id],
        )
    deadline = time.monotonic() + 5
    while endpoint_watch.ready() and time.monotonic() < deadline:
        time.sleep(0.05)  # the termination reaches the socket
    assert endpoint_for_token(token) is None
    # Listening again, it starts from an empty cache and still refuses the token.
    time.sleep(endpoint_watch.RETRY_EVERY)
    assert endpoint_watch.ready()
    assert endpoint_for_token(token) is None


def test_a_row_read_while_a_change_was_announced_is_not_kept(personas: Personas) -> None:
    digest = hash_token(personas.agent_token)
    values = _endpoint_row(digest)
    assert values is not None
    endpoint_cache.clear()
    before = endpoint_cache.generation
    endpoint_cache.forget(digest)  # announced while the row was being read
    endpoint_cache.put(digest, values, before)
    assert endpoint_cache.get(digest, 60) is None
    endpoint_cache.put(digest, values, endpoint_cache.generation)
    assert endpoint_cache.get(digest, 60) == values


def test_the_token_lookup_loads_every_field_as_the_orm_does(personas: Personas) -> None:
    """The lookup reads the row with plain SQL on the hot cursor (binary results), not the ORM:
    every field must come back with the value and type the ORM gives it."""
    endpoint_cache.clear()
    services.endpoint_revoke(actor=FIXTURE, endpoint=personas.foreign)  # a row with revoked_at
    for endpoint in (personas.agent, personas.foreign):
        endpoint.refresh_from_db()
        values = _endpoint_row(endpoint.token_hash)
        assert values is not None
        for field, value in zip(_ENDPOINT_FIELDS, values, strict=True):
            expected = getattr(endpoint, field.attname)
            assert (value, type(value)) == (expected, type(expected)), field.attname


def test_a_looked_up_endpoint_is_the_instance_from_db_builds(personas: Personas) -> None:
    """``endpoint_from_row`` skips ``Model.__init__``: the same attributes with the same values
    and state as ``Endpoint.from_db`` (its descriptors only store what they are given), and
    ``from_db`` itself while an init signal has a receiver for Endpoint."""
    values = _endpoint_row(hash_token(personas.agent_token))
    assert values is not None
    fast = endpoint_from_row(list(values))
    orm = Endpoint.from_db(DEFAULT_DB_ALIAS, _ENDPOINT_ATTNAMES, list(values))
    state = {k: v for k, v in vars(orm).items() if k != "_state"}
    assert {k: v for k, v in vars(fast).items() if k != "_state"} == state
    # ModelState makes its fields_cache on first use (__init__'s foreign key setter used it).
    assert fast._state.fields_cache == orm._state.fields_cache == {}
    assert vars(fast._state) == vars(orm._state)
    assert (fast._state.adding, fast._state.db) == (False, DEFAULT_DB_ALIAS)
    assert fast == orm and fast.holds("claim_next") and fast.owner == personas.agent.owner

    seen: list[Any] = []

    def receiver(sender: Any, instance: Any, **kwargs: Any) -> None:
        seen.append(instance)

    post_init.connect(receiver, sender=Endpoint)
    try:
        built = endpoint_from_row(list(values))
    finally:
        post_init.disconnect(receiver, sender=Endpoint)
    assert seen == [built]
