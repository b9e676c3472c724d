"""The settings a claim cycle reads, kept between reads (``switchboard.core.hotsettings``): an
override (``override_settings``, pytest-django's ``settings``) is seen at once, and the
original again once it ends."""

from __future__ import annotations

import pytest
from django.test import override_settings

from queues import sql
from queues.services.endpoints import resolve_lease_ttl
from switchboard.core.errors import InvalidArgument
from switchboard.ledger import chain
from tests.conftest import Personas


def test_the_lease_settings_follow_an_override(personas: Personas) -> None:
    endpoint = personas.agent
    endpoint.default_lease_ttl_seconds = None
    usual = resolve_lease_ttl(None, endpoint)
    with override_settings(DEFAULT_LEASE_TTL_SECONDS=7):
        assert resolve_lease_ttl(None, endpoint) == 7
        with override_settings(MAX_LEASE_TTL_SECONDS=5):
            assert resolve_lease_ttl(None, endpoint) == 5
            with pytest.raises(InvalidArgument, match="between 1 and 5"):
                resolve_lease_ttl(6, endpoint)
        assert resolve_lease_ttl(6, endpoint) == 6
    assert resolve_lease_ttl(None, endpoint) == usual


def test_the_grant_parameters_follow_a_ledger_key_override() -> None:
    actor = chain.Actor(human_id=1, human_name="someone")
    usual = sql.grant_params(actor, "w")
    with override_settings(LEDGER_KEY="another key, for this test only"):
        other = sql.grant_params(actor, "w")
        assert other["lg_ipad"] == chain.hmac_pads()[0] != usual["lg_ipad"]
    assert sql.grant_params(actor, "w") == usual
