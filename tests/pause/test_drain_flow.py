"""The issue's "done when": ``manage.py queue pause inbox --reason upgrade``, let the in-flight
work finish, upgrade, ``manage.py queue resume inbox``, drain: nothing dropped at any step."""

from __future__ import annotations

import json

from queues import services
from queues.models import Attempt, Todo, TodoState
from queues.services import Claimed, NothingClaimable
from tests.conftest import Personas, push
from tests.pause.helpers import Listener
from tests.pause.test_cli import manage


def test_pause_finish_in_flight_resume_and_drain_drops_nothing(
    tx_personas: Personas, listener: Listener
) -> None:
    p = tx_personas
    agent, agent2 = p.as_agent(), p.as_agent(p.agent2)
    backlog = push(p, 5, queue="inbox") + push(p, 2, queue="inbox", endpoint=p.agent2)
    in_flight = services.claim_next(actor=agent, queue="inbox")
    assert isinstance(in_flight, Claimed)

    paused = manage("pause", "inbox", "--reason", "upgrade", "--as", "paul", "--json")
    assert paused.returncode == 0, paused.stderr
    assert json.loads(paused.stdout)["changed"] is True
    listener.drain()

    # While paused: intake keeps working, nothing is handed out, nothing rings...
    late = push(p, 2, queue="inbox")
    assert isinstance(services.claim_next(actor=agent), NothingClaimable)
    assert isinstance(services.claim_next(actor=agent2), NothingClaimable)
    # ...and the claim made before the pause runs to its end.
    services.heartbeat(actor=agent, todo_id=in_flight.todo.id)
    assert services.complete(actor=agent, todo_id=in_flight.todo.id).state == TodoState.DONE
    assert listener.drain() == []
    assert Todo.objects.filter(state=TodoState.CLAIMED).count() == 0  # drained: safe to upgrade

    resumed = manage("resume", "inbox", "--as", "paul", "--json")
    assert resumed.returncode == 0, resumed.stderr
    assert sorted(json.loads(resumed.stdout)["woken"]) == sorted([p.agent.slug, p.agent2.slug])
    assert sorted(listener.drain()) == sorted([f"{p.agent.id}:inbox", f"{p.agent2.id}:inbox"])

    for actor in (agent, agent2):
        while isinstance(got := services.claim_next(actor=actor, queue="inbox"), Claimed):
            services.complete(actor=actor, todo_id=got.todo.id)

    everything = [t.id for t in backlog + late]
    assert Todo.objects.count() == len(everything) == 9
    assert Todo.objects.filter(pk__in=everything, state=TodoState.DONE).count() == 9
    assert all(Attempt.objects.filter(todo_id=t).count() == 1 for t in everything)
