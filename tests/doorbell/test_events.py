"""GET /api/v1/agent/events: real SSE clients on a real web process, rings counted exactly."""

from __future__ import annotations

from contextlib import ExitStack

import httpx
import pytest
from django.db import connection

from queues import doorbell, services
from queues.services import Claimed
from tests.conftest import FIXTURE, Personas, push, run_threads
from tests.doorbell.streams import attached
from tests.limits.conftest import tag
from tests.pause.helpers import pause, resume


@pytest.fixture
def server(live_url: str) -> str:
    """The session's web process (tests/mcp/conftest.py): a process per test cost a Django start
    each, and every stream here is its own endpoint's (the personas are new each test)."""
    return live_url


def _doorbell_pids() -> list[int]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s",
            [doorbell.APPLICATION_NAME],
        )
        return [row[0] for row in cursor.fetchall()]


def test_an_attached_agent_is_told_of_each_new_todo_once(
    tx_personas: Personas, server: str
) -> None:
    p = tx_personas
    with attached(server, p.agent_token) as stream:
        first, second = push(p, 2)
        (sentinel,) = push(p, 1, queue="outbox")
        rung = stream.until(str(sentinel.id))
        assert [(e["todo"], e["queue"], e["reason"]) for e in rung] == [
            (str(first.id), "inbox", "created"),
            (str(second.id), "inbox", "created"),
        ]


def test_rings_for_another_endpoint_do_not_reach_the_stream(
    tx_personas: Personas, server: str
) -> None:
    p = tx_personas
    with attached(server, p.agent_token) as stream:
        push(p, 2, endpoint=p.agent2)
        (sentinel,) = push(p, 1)
        assert stream.until(str(sentinel.id)) == []


def test_on_attach_the_stream_rings_for_up_to_three_waiting_todos(
    tx_personas: Personas, server: str
) -> None:
    p = tx_personas
    waiting = push(p, 5)
    with attached(server, p.agent_token) as stream:
        rung = [stream.next() for _ in range(3)]
        assert [(e["todo"], e["reason"]) for e in rung] == [
            (str(t.id), "waiting") for t in waiting[:3]
        ]
        (sentinel,) = push(p, 1, queue="outbox")
        assert stream.until(str(sentinel.id)) == []


def test_a_paused_queue_rings_nothing_and_its_resume_rings_once(
    tx_personas: Personas, server: str
) -> None:
    p = tx_personas
    pause(p.pauser)
    with attached(server, p.agent_token) as stream:
        held = push(p, 4)
        (sentinel,) = push(p, 1, queue="outbox")
        assert stream.until(str(sentinel.id)) == []
        resume(p.pauser)
        (sentinel,) = push(p, 1, queue="outbox")
        assert [(e["todo"], e["reason"]) for e in stream.until(str(sentinel.id))] == [
            (str(held[0].id), "resumed")
        ]


def test_resuming_with_last_event_id_rings_only_what_changed_since(
    tx_personas: Personas, server: str
) -> None:
    p = tx_personas
    (old,) = push(p, 1)
    with attached(server, p.agent_token) as stream:
        assert stream.next()["todo"] == str(old.id)
        last = stream.last_id
    (new,) = push(p, 1)
    with attached(server, p.agent_token, last_event_id=last) as again:
        assert [(e["todo"], e["reason"]) for e in [again.next()]] == [(str(new.id), "waiting")]
        (sentinel,) = push(p, 1, queue="outbox")
        assert again.until(str(sentinel.id)) == []


def test_resuming_with_nothing_new_still_reminds_of_work_that_waits(
    tx_personas: Personas, server: str
) -> None:
    """An attach rings three of the waiting todos; an agent that left before draining them and
    resumes with Last-Event-ID was told nothing more, however much waited."""
    p = tx_personas
    todos = push(p, 5)
    with attached(server, p.agent_token) as stream:
        told = [stream.next()["todo"] for _ in range(3)]
        last = stream.last_id
    assert told == [str(t.id) for t in todos[:3]]
    with attached(server, p.agent_token, last_event_id=last) as again:
        reminder = again.next()
        assert (reminder["todo"], reminder["reason"]) == (str(todos[0].id), "waiting")
        (sentinel,) = push(p, 1, queue="outbox")
        assert again.until(str(sentinel.id)) == []


def test_rings_resume_after_the_listen_connection_is_terminated(
    tx_personas: Personas, server: str
) -> None:
    p = tx_personas
    with attached(server, p.agent_token) as stream:
        # Every server of this test session on this database has a doorbell (the MCP tests start
        # one of their own): end them all, so this server's is among them whichever it is.
        before = set(_doorbell_pids())
        assert before
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) pid", [list(before)]
            )
        # Pushed while nobody listens: the NOTIFY is lost; the re-ring after reconnecting finds it.
        (missed,) = push(p, 1)
        assert stream.next(timeout=30)["todo"] == str(missed.id)
        after = set(_doorbell_pids())
        assert after and after.isdisjoint(before)
        assert isinstance(services.claim_next(actor=p.as_agent()), Claimed)
        (fresh,) = push(p, 1)
        assert [(e["todo"], e["reason"]) for e in [stream.next()]] == [(str(fresh.id), "created")]


def _database_sessions() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()")
        return int(cursor.fetchone()[0])


def test_open_streams_hold_no_database_connection_each(tx_personas: Personas, server: str) -> None:
    p = tx_personas
    with attached(server, p.agent_token):  # the doorbell's LISTEN is up from here
        before = _database_sessions()
        with ExitStack() as streams:
            for _ in range(12):
                streams.enter_context(attached(server, p.agent_token))
            assert _database_sessions() <= before + 1  # an executor thread's, at most


def test_the_stream_refuses_a_missing_or_unknown_token(server: str) -> None:
    response = httpx.get(f"{server}/api/v1/agent/events")
    assert response.status_code == 401
    assert response.json()["code"] == "unauthorized"
    response = httpx.get(
        f"{server}/api/v1/agent/events", headers={"Authorization": "Bearer sbk_nope"}
    )
    assert response.status_code == 401


def test_the_stream_keeps_the_apis_conventions(tx_personas: Personas, server: str) -> None:
    """Not a ninja route, so none of the API's wrappers: a wrong method was an empty text/html
    405, an unknown parameter was ignored, and a refusal could be cached."""
    bearer = {"Authorization": f"Bearer {tx_personas.agent_token}"}
    for method in ("POST", "PUT", "DELETE"):
        response = httpx.request(method, f"{server}/api/v1/agent/events", headers=bearer)
        assert response.status_code == 405 and response.headers["Allow"] == "GET, HEAD"
        assert response.json()["code"] == "method_not_allowed"
        assert response.json()["allowed"] == ["GET", "HEAD"]
    head = httpx.head(f"{server}/api/v1/agent/events", headers=bearer)
    assert head.status_code == 200 and head.content == b""
    assert head.headers["Content-Type"].startswith("text/event-stream")
    assert httpx.head(f"{server}/api/v1/agent/events").status_code == 401
    unknown = httpx.get(f"{server}/api/v1/agent/events?bogus=1", headers=bearer)
    assert unknown.status_code == 400 and unknown.json()["field"] == "bogus"
    assert unknown.headers["Cache-Control"] == "no-store"
    anonymous = httpx.get(f"{server}/api/v1/agent/events?bogus=1")
    assert anonymous.status_code == 401  # the credentials first, as on every route
    assert anonymous.headers["Cache-Control"] == "no-store"


def test_a_revoke_ends_the_endpoints_open_streams_and_no_other(
    tx_personas: Personas, server: str
) -> None:
    # The stream outlived the token: a revoked agent kept its stream (keepalives for ever), so
    # one the revoke meant to cut off still heard of work. It ends at the revoke's commit.
    p = tx_personas
    with attached(server, p.agent_token) as revoked, attached(server, p.agent2_token) as other:
        services.endpoint_revoke(endpoint=p.agent, actor=FIXTURE)
        revoked._thread.join(timeout=10)  # the server closed it: the reader saw the end
        assert not revoked._thread.is_alive()
        (sentinel,) = push(p, 1, endpoint=p.agent2)
        assert other.until(str(sentinel.id)) == []  # the other endpoint's stream still rings
    again = httpx.get(
        f"{server}/api/v1/agent/events", headers={"Authorization": f"Bearer {p.agent_token}"}
    )
    assert again.status_code == 401  # what the agent's reconnect is told


def test_a_revoke_while_nobody_listened_ends_the_stream_at_the_reconnect(
    tx_personas: Personas, server: str
) -> None:
    # The revoke's NOTIFY is lost while the doorbell reconnects; the reconnect asks which of
    # its endpoints were revoked meanwhile, as it asks what became claimable.
    p = tx_personas
    with attached(server, p.agent_token) as stream:
        with connection.cursor() as cursor:
            cursor.execute(
                "UPDATE queues_endpoint SET state = 'revoked', revoked_at = now() WHERE id = %s",
                [p.agent.id],
            )
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) pid", [_doorbell_pids()]
            )
        stream._thread.join(timeout=30)
        assert not stream._thread.is_alive()


def test_on_attach_a_todo_carrying_tags_is_rung_as_any_other(
    tx_personas: Personas, server: str
) -> None:
    # The tag gate's key is the todo's tags, an array: used as a dict key it raised
    # "unhashable type: 'list'" and the attach rang nothing for such an endpoint.
    p = tx_personas
    tag("vendor.a", 5)
    [untagged] = push(p, 1)
    [tagged] = push(p, 1, tags=["vendor.a"])
    with attached(server, p.agent_token) as stream:
        rung = [stream.next() for _ in range(2)]
    assert [(e["todo"], e["reason"]) for e in rung] == [
        (str(untagged.id), "waiting"),
        (str(tagged.id), "waiting"),
    ]


def test_every_event_of_a_stream_has_an_id_of_its_own_and_resumes_from_any(
    tx_personas: Personas, server: str
) -> None:
    """An attach rang three todos in the same millisecond under one id: a client dropping ids
    it has seen (de-duplicating after a reconnect) lost the second and the third."""
    p = tx_personas
    todos = push(p, 3)
    with attached(server, p.agent_token) as stream:
        rung = [stream.next() for _ in range(3)]
    assert [e["todo"] for e in rung] == [str(t.id) for t in todos]
    ids = [e["id"] for e in rung]
    assert len(set(ids)) == 3, ids
    # Any of them resumes the stream as the millisecond it names.
    (new,) = push(p, 1)
    with attached(server, p.agent_token, last_event_id=ids[-1]) as again:
        assert again.next()["todo"] == str(new.id)


@pytest.mark.parametrize(
    ("last", "since"),
    [
        ("1796475332296", 1796475332296),
        ("1796475332296-2", 1796475332296),
        ("1796475332296-", None),
        ("1796475332296-x", None),
        ("1796475332296-\u00b2", None),  # '²' passes str.isdigit()
        ("\u0661\u0662", None),
        ("-2", None),
        ("abc", None),
        ("", None),
    ],
)
def test_a_last_event_id_names_the_millisecond_it_was_made(last: str, since: int | None) -> None:
    instant = doorbell.since_event(last)
    assert (None if instant is None else round(instant.timestamp() * 1000)) == since


def test_event_ids_never_repeat_or_go_back_within_a_process() -> None:
    ids = [doorbell._event_id() for _ in range(2000)]
    keys = [tuple(int(part) for part in i.split("-")) + (0,) * (1 - i.count("-")) for i in ids]
    assert len(set(ids)) == len(ids)
    assert keys == sorted(keys)


def test_event_ids_made_on_many_threads_at_once_never_repeat(transactional_db: None) -> None:
    """An attach makes its rings' ids on an executor thread while the loop makes a dispatch's:
    the process's ids stay unique across threads (ids of the millisecond alone, as before,
    repeat here by the thousand). Without the lock this passed in five runs too: it shows the
    ids unique, not that the lock is needed."""
    made = run_threads(8, lambda _: [doorbell._event_id() for _ in range(3000)])
    ids = [i for per_thread in made for i in per_thread]
    assert len(ids) == 24000 and len(set(ids)) == len(ids)
    for per_thread in made:  # and each thread sees them only go forward
        keys = [tuple(int(p) for p in i.split("-")) + (0,) * (1 - i.count("-")) for i in per_thread]
        assert keys == sorted(keys)
