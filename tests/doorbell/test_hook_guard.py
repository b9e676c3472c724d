"""The SSRF guard: a hook URL may reach only public addresses, checked when it is set and again
when the hook connects (a name may resolve elsewhere by then); an allow-list lets an operator's
own receivers in."""

from __future__ import annotations

from typing import Any

import pytest

from queues import services
from queues.models import Endpoint
from switchboard.core.errors import InvalidArgument
from switchboard.ledger.models import LedgerEntry
from tests.conftest import FIXTURE, Personas, push
from tests.doorbell.streams import wait_for
from tests.pause.conftest import HookServer

REFUSED = [
    "http://127.0.0.1:9/hook",
    "http://localhost:9/hook",  # a name: refused for what it resolves to
    "http://[::1]:9/hook",
    "http://[::ffff:127.0.0.1]:9/hook",  # IPv4 inside IPv6 is judged as the IPv4 address
    "http://10.1.2.3/hook",
    "http://192.168.0.10/hook",
    "http://172.16.5.5/hook",
    "http://169.254.169.254/latest/meta-data",  # the cloud metadata service (link-local)
    "http://[fe80::1]/hook",
    "http://100.64.0.1/hook",  # shared address space
    "http://0.0.0.0/hook",
    "http://224.0.0.1/hook",
]


@pytest.mark.parametrize("url", REFUSED)
def test_vending_with_a_hook_into_the_servers_own_network_is_refused_and_makes_nothing(
    db: None, personas: Personas, url: str
) -> None:
    p = personas
    with pytest.raises(InvalidArgument) as refused:
        services.endpoint_vend(
            actor=FIXTURE, owner=p.owner, name="Sneaky", queues=["inbox"], notify_url=url
        )
    assert refused.value.field == "notify_url"
    assert not Endpoint.objects.filter(name="Sneaky").exists()


@pytest.mark.parametrize("url", ["http://127.0.0.1:9/hook", "http://[fe80::1]/x"])
def test_changing_the_hook_to_a_private_address_is_refused_and_changes_nothing(
    db: None, personas: Personas, url: str
) -> None:
    p = personas
    before = LedgerEntry.objects.count()
    with pytest.raises(InvalidArgument) as refused:
        services.endpoint_update(endpoint=p.agent, actor=p.as_human(p.owner), notify_url=url)
    assert refused.value.field == "notify_url"
    p.agent.refresh_from_db()
    assert (p.agent.notify_url, p.agent.notify_secret) == ("", "")
    assert LedgerEntry.objects.count() == before


def test_a_host_that_does_not_resolve_is_refused(db: None, personas: Personas) -> None:
    with pytest.raises(InvalidArgument, match="does not resolve"):
        services.endpoint_update(
            endpoint=personas.agent,
            actor=personas.as_human(personas.owner),
            notify_url="https://no-such-host.invalid/hook",
        )


def test_a_network_on_the_allow_list_is_accepted(
    db: None, personas: Personas, settings: Any
) -> None:
    settings.HOOK_ALLOWED_NETWORKS = ["10.0.0.0/8"]
    endpoint, _ = services.endpoint_vend(
        actor=FIXTURE,
        owner=personas.owner,
        name="Inside",
        queues=["inbox"],
        notify_url="http://10.1.2.3/hook",
    )
    assert endpoint.notify_url == "http://10.1.2.3/hook"
    with pytest.raises(InvalidArgument):  # only that network
        services.endpoint_update(
            endpoint=endpoint, actor=personas.as_human(personas.owner), notify_url="http://[::1]/"
        )


def test_a_hook_address_allowed_when_set_but_not_at_delivery_is_refused_at_connect_time(
    tx_personas: Personas, hook_server: HookServer, celery_worker: Any, settings: Any
) -> None:
    """The URL passed the check when it was set (the receiver was allowed then); by delivery
    time it is not allowed, as after a DNS rebinding: the receiver is never called, and after
    the last attempt the endpoint shows why."""
    p = tx_personas
    services.endpoint_update(
        endpoint=p.agent, actor=p.as_human(p.owner), notify_url=hook_server.url
    )
    settings.HOOK_ALLOWED_NETWORKS = []
    settings.HOOK_RETRY_SECONDS = 0
    push(p, 1)
    assert wait_for(lambda: Endpoint.objects.get(pk=p.agent.pk).hook_failed_at is not None)
    assert hook_server.posts == []
    p.agent.refresh_from_db()
    assert "loopback" in p.agent.hook_error
