"""A web process may keep agents' endpoint rows for ENDPOINT_CACHE_SECONDS (queues/auth.py), so
an agent request skips the token lookup; a revoke still takes effect: at once in the process that
saved it, within the TTL in every other. Off by default, when a revoke is exact everywhere."""

from __future__ import annotations

import time

import httpx
from django.conf import settings
from django.db import connection
from django.test import Client, override_settings

from queues import services
from queues.auth import _ENDPOINT_FIELDS, _endpoint_row, endpoint_cache, endpoint_for_token
from queues.models import EndpointState
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
    assert settings.ENDPOINT_CACHE_SECONDS == 0
    push(tx_personas, 1)
    auth = {"Authorization": f"Bearer {tx_personas.agent_token}"}
    with live_server(database_url()) as base:
        url = f"{base}/api/v1/agent/claim_next"
        assert httpx.post(url, headers=auth, json={}, timeout=30).status_code == 200
        services.endpoint_revoke(actor=FIXTURE, endpoint=tx_personas.agent)
        refused = httpx.post(url, headers=auth, json={}, timeout=30)
        assert (refused.status_code, refused.json()["code"]) == (401, "unauthorized")


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
