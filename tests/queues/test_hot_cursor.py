"""The hot cursor (queues.sql.hot_cursor): one psycopg cursor kept per connection, a cursor of its
own for a nested use, statement conversions kept past psycopg's 4,096-character limit, and
claimed todos built without Model.__init__ (issue 12: a claim cycle's client CPU)."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import DataError, connection, transaction
from django.db.models.signals import post_init
from django.db.transaction import TransactionManagementError
from psycopg.pq import TransactionStatus
from psycopg.rows import dict_row, tuple_row

from queues import services, sql
from queues.models import Todo
from queues.schemas import one_todo_out
from queues.services import Claimed
from tests.conftest import Personas, push


def test_the_cursor_is_kept_between_statements_and_a_nested_use_gets_its_own(
    personas: Personas,
) -> None:
    with sql.hot_cursor() as outer:
        outer.execute("SELECT g FROM generate_series(1, 3) g")
        with sql.hot_cursor() as inner:
            assert inner.cursor is not outer.cursor
            inner.execute("SELECT 42")
            assert inner.fetchone() == (42,)
        # The nested statement did not replace the results the outer use has not read.
        assert [r[0] for r in outer.fetchall()] == [1, 2, 3]
        kept = outer.cursor
    with sql.hot_cursor() as again:
        assert again.cursor is kept
        again.execute("SELECT 7")
        assert again.fetchone() == (7,)


def test_the_kept_cursor_is_lent_in_one_wrapper_and_a_nested_use_in_its_own(
    personas: Personas,
) -> None:
    """Lending the kept cursor builds no wrapper (issue 12: twice per claim cycle); a nested
    use's wrapper holds its own cursor, and the kept one's still holds the kept cursor."""
    with sql.hot_cursor() as first:
        first.execute("SELECT 1")
        assert first.fetchone() == (1,)
        with sql.hot_cursor() as nested:
            assert nested is not first and nested.cursor is not first.cursor
            nested.execute("SELECT 2")
            assert nested.fetchone() == (2,)
    with sql.hot_cursor() as again:
        assert again is first and again.cursor is first.cursor
        assert again.db is sql.default_connection()
        again.execute("SELECT 3")
        assert again.fetchone() == (3,)


def test_another_connection_or_a_closed_cursor_gets_a_new_cursor(personas: Personas) -> None:
    with sql.hot_cursor() as first:
        first.execute("SELECT 1")
        kept = first.cursor
    # The kept cursor belongs to a connection the wrapper no longer holds (a pooled connection
    # handed back and another taken): never reused.
    connection._hot_cursor = (object(), kept, [False])  # type: ignore[attr-defined]
    with sql.hot_cursor() as second:
        assert second.cursor is not kept
        second.execute("SELECT 2")
        assert second.fetchone() == (2,)
        fresh = second.cursor
    fresh.close()
    with sql.hot_cursor() as third:
        assert third.cursor is not fresh
        third.execute("SELECT 3")
        assert third.fetchone() == (3,)


def test_a_statement_longer_than_psycopg_caches_is_converted_once_and_binds_right(
    personas: Personas,
) -> None:
    padding = " ".join(f"%(p{i})s::int AS c{i}," for i in range(400))
    statement = f"SELECT {padding} %(last)s::text AS last"
    assert len(statement) > 4096
    params: dict[str, Any] = {f"p{i}": i for i in range(400)}
    for last in ("a", "b"):
        with sql.hot_cursor() as cursor:
            cursor.execute(statement, {**params, "last": last})
            row = cursor.fetchone()
        assert row[0] == 0 and row[399] == 399 and row[400] == last
    assert any(key[0] == statement for key in sql._converted)


def test_a_claimed_todo_is_the_row_the_orm_would_load(personas: Personas) -> None:
    (todo,) = push(personas, 1, payload={"x": [1, 2]})
    claimed = services.claim_next(actor=personas.as_agent(), claimant="w")
    assert isinstance(claimed, Claimed)
    loaded = Todo.objects.get(pk=todo.id)
    built = claimed.todo
    assert not built._state.adding and built._state.db == "default"
    # The answered fields as stored; the others deferred (as ``.only()`` leaves them), read from
    # the database as stored when asked.
    unanswered = {"idempotency_key", "source", "claimed_at", "finished_at", "rings"}
    unanswered |= {"rung_since", "stall_rung_at", "lease_token_hash", "claim_via", "retried_after"}
    assert built.get_deferred_fields() == unanswered
    fields = [f.attname for f in Todo._meta.concrete_fields]
    answered = [f for f in fields if f not in unanswered]
    assert {f: built.__dict__[f] for f in answered} == {f: getattr(loaded, f) for f in answered}
    assert {f: getattr(built, f) for f in fields} == {f: getattr(loaded, f) for f in fields}
    assert built.get_deferred_fields() == set()
    assert built.payload == {"x": [1, 2]} and built.endpoint.pk == loaded.endpoint_id
    # Saved as the ORM's own instance would be: an update, not an insert.
    built.title = "renamed"
    built.save(update_fields=["title"])
    assert Todo.objects.get(pk=todo.id).title == "renamed"


def test_every_verb_answers_from_the_fields_its_statement_returned(personas: Personas) -> None:
    """The answer of each claim and transition (``todo_out``, every surface's) reads no field the
    statement left deferred: the todo is shown as the statement answered it, with no query."""
    actor = personas.as_agent()
    first, second, third = push(personas, 3, payload={"x": 1})
    claimed = services.claim_next(actor=actor, claimant="w")
    assert isinstance(claimed, Claimed) and claimed.todo.id == first.id
    answers = [
        claimed.todo,
        services.heartbeat(actor=actor, todo_id=first.id),
        services.complete(actor=actor, todo_id=first.id, result={"ok": 1}),
        services.claim(actor=actor, todo_id=second.id).todo,
        services.fail(actor=actor, todo_id=second.id, error="e"),
    ]
    services.claim(actor=actor, todo_id=third.id)
    answers.append(services.release(actor=actor, todo_id=third.id))
    for todo in answers:
        deferred = todo.get_deferred_fields()
        assert deferred and "title" not in deferred
        shown = one_todo_out(todo)
        assert todo.get_deferred_fields() == deferred, shown
    assert [a["state"] for a in map(one_todo_out, answers)] == [
        "claimed",
        "claimed",
        "done",
        "claimed",
        "failed",
        "pending",
    ]
    assert one_todo_out(answers[2])["result"] == {"ok": 1}


def test_init_signal_listeners_still_see_claimed_todos(personas: Personas) -> None:
    push(personas, 1)
    seen: list[Todo] = []

    def listener(sender: type[Todo], instance: Todo, **kwargs: object) -> None:
        seen.append(instance)

    post_init.connect(listener, sender=Todo)
    try:
        claimed = services.claim_next(actor=personas.as_agent(), claimant="w")
    finally:
        post_init.disconnect(listener, sender=Todo)
    assert isinstance(claimed, Claimed)
    assert claimed.todo in seen


def _prepared_on(cursor: Any, statement: str, params: dict[str, Any]) -> None:
    """Run ``statement`` until psycopg has prepared it on this connection."""
    for _ in range(8):
        cursor.execute(statement, params)
        cursor.fetchall()


def test_the_short_way_makes_rows_with_the_cursors_row_factory(tx_personas: Personas) -> None:
    """Tuples (the hot cursor's own factory) are made by ``tuple`` directly; any other row
    factory still makes the rows of a statement sent the short way."""
    statement = "SELECT %(n)s::int AS n"
    with sql.hot_cursor() as cursor:
        _prepared_on(cursor, statement, {"n": 1})
        raw = cursor.cursor
        assert raw.execute_prepared(statement, {"n": 2})
        assert cursor.fetchone() == (2,)
        raw.row_factory = dict_row
        try:
            assert raw.execute_prepared(statement, {"n": 3})
            assert cursor.fetchone() == {"n": 3}
        finally:
            raw.row_factory = tuple_row
        assert raw.execute_prepared(statement, {"n": 4})
        assert cursor.fetchone() == (4,)


def test_a_prepared_statement_goes_the_short_way_with_the_same_rows(
    tx_personas: Personas,
) -> None:
    statement = "SELECT %(a)s::int + g, %(b)s::text FROM generate_series(1, 2) g"
    with sql.hot_cursor() as cursor:
        raw = cursor.cursor
        assert not raw.execute_prepared(statement, {"a": 1, "b": "x"})  # not prepared yet
        _prepared_on(cursor, statement, {"a": 1, "b": "x"})
        assert raw.execute_prepared(statement, {"a": 10, "b": "y"})
        assert cursor.fetchall() == [(11, "y"), (12, "y")]
        cursor.execute(statement, {"a": 20, "b": "z"})  # the wrapper's execute, short way
        assert cursor.rowcount == 2 and cursor.fetchone() == (21, "z")


def test_an_error_on_the_short_way_is_djangos_and_the_connection_goes_on(
    tx_personas: Personas,
) -> None:
    statement = "SELECT 10 / %(d)s::int"
    with sql.hot_cursor() as cursor:
        _prepared_on(cursor, statement, {"d": 5})
        with pytest.raises(DataError, match="division by zero"):
            cursor.execute(statement, {"d": 0})
        cursor.execute(statement, {"d": 2})
        assert cursor.fetchone() == (5,)


def test_in_a_transaction_the_short_way_begins_it_and_a_rollback_undoes_the_statement(
    tx_personas: Personas,
) -> None:
    """Inside atomic() psycopg begins the transaction at the first statement: the short way
    leaves that statement to ``execute``, or it would run outside the transaction (committed
    at once, never rolled back)."""
    statement = "UPDATE queues_endpoint SET name = %(name)s WHERE id = %(id)s RETURNING name"
    endpoint = tx_personas.agent
    before = endpoint.name
    with sql.hot_cursor() as cursor:
        _prepared_on(cursor, statement, {"name": before, "id": endpoint.id})
    with transaction.atomic():
        with sql.hot_cursor() as cursor:
            cursor.execute(
                statement, {"name": "renamed in a rolled-back transaction", "id": endpoint.id}
            )
            assert cursor.fetchone() == ("renamed in a rolled-back transaction",)
            assert connection.connection.info.transaction_status == TransactionStatus.INTRANS
        transaction.set_rollback(True)
    endpoint.refresh_from_db()
    assert endpoint.name == before


def test_an_execute_wrapper_sees_every_hot_statement(tx_personas: Personas) -> None:
    statement = "SELECT %(a)s::int"
    seen: list[str] = []

    def wrapper(execute: Any, sql_: str, params: Any, many: bool, context: Any) -> Any:
        seen.append(sql_)
        return execute(sql_, params, many, context)

    with sql.hot_cursor() as cursor:
        _prepared_on(cursor, statement, {"a": 1})
        with connection.execute_wrapper(wrapper):
            cursor.execute(statement, {"a": 2})
            assert cursor.fetchone() == (2,)
    assert seen == [statement]


def test_claim_and_completion_alternating_keep_one_transformer(personas: Personas) -> None:
    """psycopg replaces a cursor's Transformer (its adapters' caches) when the statement
    changes; the hot cursor keeps it across the claim and the completion."""
    push(personas, 3)
    agent = personas.as_agent()
    with sql.hot_cursor() as cursor:
        cursor.execute("SELECT 1", {})
        transformer = cursor.cursor._tx
    for _ in range(3):
        claimed = services.claim_next(actor=agent, claimant="w")
        assert isinstance(claimed, Claimed)
        services.complete(actor=agent, todo_id=claimed.todo.id)
    with sql.hot_cursor() as cursor:
        assert cursor.cursor._tx is transformer


def test_a_parameter_bound_again_changed_is_dumped_anew(tx_personas: Personas) -> None:
    """The hot cursor dumps again only the parameters that changed since it last bound the
    statement: a list changed in place, an equal value of another type and a value that
    became NULL (or stopped being one) are each bound as they are now."""
    statement = "SELECT %(names)s::text[], %(v)s::text, %(n)s::text"
    names = ["a"]
    with sql.hot_cursor() as cursor:
        _prepared_on(cursor, statement, {"names": names, "v": 1, "n": "x"})
        raw = cursor.cursor
        assert raw.execute_prepared(statement, {"names": names, "v": 1, "n": "x"})
        assert cursor.fetchone() == (["a"], "1", "x")
        names.append("b")  # the very list it bound last time, changed in place
        assert raw.execute_prepared(statement, {"names": names, "v": 1, "n": "x"})
        assert cursor.fetchone() == (["a", "b"], "1", "x")
        names[1] = "c"
        assert raw.execute_prepared(statement, {"names": names, "v": 1, "n": "x"})
        assert cursor.fetchone() == (["a", "c"], "1", "x")
        # True == 1, but binds as a boolean (another prepared statement: the long way).
        cursor.execute(statement, {"names": names, "v": True, "n": None})
        assert cursor.fetchone() == (["a", "c"], "true", None)
        cursor.execute(statement, {"names": names, "v": 1, "n": "y"})
        assert cursor.fetchone() == (["a", "c"], "1", "y")


def test_a_claim_after_its_endpoints_scope_changed_draws_from_the_new_scope(
    personas: Personas,
) -> None:
    """claim_next binds the endpoint's queues on every claim: narrowed on the kept cursor
    after a run of claims (its statement prepared, its queues bound), the next claim takes
    from the new scope only."""
    endpoint = personas.agent
    endpoint.scope_queues = ["inbox", "outbox"]
    endpoint.save(update_fields=["scope_queues"])
    push(personas, 8, queue="inbox")
    (outbox,) = push(personas, 1, queue="outbox")
    agent = personas.as_agent(endpoint)
    for _ in range(7):
        claimed = services.claim_next(actor=agent, claimant="w")
        assert isinstance(claimed, Claimed) and claimed.todo.queue == "inbox"
        services.complete(actor=agent, todo_id=claimed.todo.id)
    endpoint.scope_queues = ["outbox"]
    endpoint.save(update_fields=["scope_queues"])
    claimed = services.claim_next(actor=personas.as_agent(endpoint), claimant="w")
    assert isinstance(claimed, Claimed) and claimed.todo.id == outbox.id


def test_a_statement_bound_again_unchanged_sends_the_query_it_sent_last_time(
    tx_personas: Personas,
) -> None:
    """Nothing changed since the last bind: the very query object psycopg sent is handed out
    again (nothing converted, copied or dumped); one changed parameter makes a new one."""
    statement = "SELECT %(names)s::text[], %(n)s::int"
    with sql.hot_cursor() as cursor:
        _prepared_on(cursor, statement, {"names": ["a"], "n": 1})
        raw = cursor.cursor
        assert raw.execute_prepared(statement, {"names": ["a"], "n": 1})
        sent = raw._query
        assert raw.execute_prepared(statement, {"names": ["a"], "n": 1})  # an equal new list
        assert raw._query is sent and cursor.fetchone() == (["a"], 1)
        assert raw.execute_prepared(statement, {"names": ["a"], "n": 2})
        assert raw._query is not sent and cursor.fetchone() == (["a"], 2)
        assert sent.params != raw._query.params  # the query sent before was left as it was


def test_an_error_on_the_short_way_in_a_transaction_breaks_it_as_djangos_own_would(
    tx_personas: Personas,
) -> None:
    """The short way enters Django's error translation only once an error is raised: the error
    is Django's, and once it leaves an atomic block the transaction is broken, so the next
    statement on the short way is refused as Django's own cursor refuses it."""
    statement = "SELECT 10 / %(d)s::int"
    with sql.hot_cursor() as cursor:
        _prepared_on(cursor, statement, {"d": 5})
    # Marked for rollback with no error in the server (its transaction still usable there).
    with transaction.atomic(), sql.hot_cursor() as cursor:
        cursor.execute(statement, {"d": 5})  # begins the transaction: the next go the short way
        assert cursor.fetchone() == (2,)
        transaction.set_rollback(True)
        with pytest.raises(TransactionManagementError):
            cursor.execute(statement, {"d": 2})
    # Broken by an error that left an atomic block (psycopg then forgets what it prepared).
    with transaction.atomic(), sql.hot_cursor() as cursor:
        _prepared_on(cursor, statement, {"d": 5})  # again: a rollback forgets them too
        with (
            pytest.raises(DataError, match="division by zero"),
            transaction.atomic(savepoint=False),
        ):
            assert cursor.cursor.execute_prepared(statement, {"d": 1})
            cursor.execute(statement, {"d": 0})
        assert connection.needs_rollback
        with pytest.raises(TransactionManagementError):
            cursor.execute(statement, {"d": 2})


def test_the_default_connection_is_this_threads_as_djangos_lookup_answers() -> None:
    """``sql.default_connection`` reads the thread's connection without asgiref's lookup: in
    another thread it is that thread's own (made there on first use), under an event loop
    Django's lookup answers, and each is the very one ``connections[...]`` gives there."""
    import asyncio
    import threading

    from django.db import DEFAULT_DB_ALIAS, connections

    assert sql._THREAD_CONNECTIONS is not None  # asgiref's Local as pinned: the short way
    here = sql.default_connection()
    assert here is connections[DEFAULT_DB_ALIAS]
    seen: dict[str, Any] = {}

    def elsewhere() -> None:
        try:
            seen["first"] = sql.default_connection()  # none made in this thread yet
            seen["again"] = sql.default_connection()
            seen["django"] = connections[DEFAULT_DB_ALIAS]

            async def in_a_loop() -> None:
                seen["loop"] = sql.default_connection()
                seen["loop_django"] = connections[DEFAULT_DB_ALIAS]

            asyncio.run(in_a_loop())
        finally:
            connections.close_all()

    thread = threading.Thread(target=elsewhere)
    thread.start()
    thread.join()
    assert seen["first"] is seen["again"] is seen["django"]
    assert seen["first"] is not here
    assert seen["loop"] is seen["loop_django"]
