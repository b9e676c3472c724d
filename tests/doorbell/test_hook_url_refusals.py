"""The notify URL's own shape, checked when it is set: a port from 1 to 65535, no user name or
password (the hook would drop them), a 6to4 address judged as the IPv4 address it carries, a
malformed host refused as cleanly as any other; and a scheme in capitals is still http(s)."""

from __future__ import annotations

import pytest

from queues import hookguard, services
from queues.models import Endpoint
from switchboard.core.errors import InvalidArgument
from switchboard.ledger.models import LedgerEntry
from tests.conftest import FIXTURE, Personas

REFUSED = {
    "http://1.1.1.1:0/": "port is not a number from 1 to 65535",
    "http://[::ffff:1.1.1.1]:0/x": "port is not a number from 1 to 65535",
    "http://[2002:7f00:1::]/": "loopback",  # 6to4 carrying 127.0.0.1
    "http://[2002:a00:1::]/hook": "private",  # 6to4 carrying 10.0.0.1
    "http://[1.1.1.1]/": "not a valid URL",
    "http://user:pw@1.1.1.1/": "must not carry a user name or password",
    "https://token@1.1.1.1/hook": "must not carry a user name or password",
    # Accepted once, then every delivery raised UnicodeEncodeError (never retried, never shown).
    "http://1.1.1.1/hoök": "must be ASCII without spaces",
    "http://1.1.1.1/a b": "must be ASCII without spaces",
    "http://1.1.1.1/x?q=ü": "must be ASCII without spaces",
}


@pytest.mark.parametrize(("url", "why"), REFUSED.items())
def test_setting_a_malformed_or_disguised_hook_url_is_refused_naming_the_field(
    db: None, personas: Personas, url: str, why: str
) -> None:
    p = personas
    before = LedgerEntry.objects.count()
    with pytest.raises(InvalidArgument) as refused:
        services.endpoint_update(endpoint=p.agent, actor=p.as_human(p.owner), notify_url=url)
    assert refused.value.field == "notify_url"
    assert refused.value.message.startswith("notify_url ")
    assert why in refused.value.message
    p.agent.refresh_from_db()
    assert (p.agent.notify_url, p.agent.notify_secret) == ("", "")
    assert LedgerEntry.objects.count() == before


@pytest.mark.parametrize("url", REFUSED)
def test_vending_with_such_a_hook_url_makes_nothing(db: None, personas: Personas, url: str) -> None:
    with pytest.raises(InvalidArgument) as refused:
        services.endpoint_vend(
            actor=FIXTURE, owner=personas.owner, name="Odd", queues=["inbox"], notify_url=url
        )
    assert refused.value.field == "notify_url"
    assert not Endpoint.objects.filter(name="Odd").exists()


def test_a_6to4_address_carrying_a_public_address_is_accepted(db: None, personas: Personas) -> None:
    url = "http://[2002:101:101::]/hook"  # 1.1.1.1
    endpoint = services.endpoint_update(
        endpoint=personas.agent, actor=personas.as_human(personas.owner), notify_url=url
    )
    assert endpoint.notify_url == url


def test_the_guard_takes_a_scheme_in_any_case_and_gives_it_back_in_lower_case() -> None:
    assert hookguard.check_url("HTTP://1.1.1.1/hook?a=B") == "http://1.1.1.1/hook?a=B"
    assert hookguard.check_url("Https://1.1.1.1/") == "https://1.1.1.1/"


def test_a_scheme_in_capitals_is_taken_and_stored_in_lower_case(personas: Personas) -> None:
    # "HTTP://1.1.1.1/" passed the admin's URL field, then was refused as "notify_url must be an
    # http(s) URL".
    p = personas
    endpoint = services.endpoint_update(
        endpoint=p.agent, actor=p.as_human(p.owner), notify_url="HTTP://1.1.1.1/hook"
    )
    assert endpoint.notify_url == "http://1.1.1.1/hook"
    assert Endpoint.objects.get(pk=p.agent.pk).notify_url == "http://1.1.1.1/hook"
