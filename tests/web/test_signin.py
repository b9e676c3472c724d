"""Sign-in throttling (switchboard/console/signin.py): each account's attempts, at the console's
and the admin's sign-in alike, share one bucket in Redis; a refused attempt checks nothing."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.test import Client

from switchboard.core import counters, ratelimit
from tests.conftest import Personas, run_threads


@pytest.fixture(autouse=True)
def _fresh_buckets() -> Iterator[None]:
    def clear() -> None:
        client = counters.client()
        for key in client.scan_iter(f"{ratelimit._BUCKET}signin:*"):
            client.delete(key)

    clear()
    yield
    clear()


def sign_in(client: Client, url: str, username: str, password: str) -> Any:
    return client.post(url, {"username": username, "password": password, "next": "/"})


THROTTLED = "Too many sign-in attempts for this account"


@pytest.mark.parametrize("url", ["/login/", "/admin/login/"])
def test_an_account_is_throttled_after_its_burst_and_the_right_password_then_waits(
    personas: Personas, settings: Any, url: str
) -> None:
    settings.SIGNIN_RATE_LIMIT = (0.001, 3)  # three at once, then one every ~17 minutes
    client = Client()
    username = "ada" if url.startswith("/admin/") else "olive"
    for _ in range(3):
        refused = sign_in(client, url, username, "wrong-guess")
        assert refused.status_code == 200 and THROTTLED not in refused.content.decode()
        assert "_auth_user_id" not in client.session
    right = f"pw-{username}-123"
    throttled = sign_in(client, url, username, right)
    assert throttled.status_code == 200
    assert THROTTLED in throttled.content.decode() and "try again in" in throttled.content.decode()
    assert "_auth_user_id" not in client.session  # the right password was not even checked
    # The name as typed, case-folded, whether or not such an account exists: the same bucket.
    assert THROTTLED in sign_in(client, url, username.upper(), right).content.decode()
    # Another account is not held up.
    other = Client()
    signed = sign_in(other, "/login/", "otto", "pw-otto-123")
    assert signed.status_code == 302 and "_auth_user_id" in other.session


def test_the_console_and_the_admin_share_an_accounts_bucket(
    personas: Personas, settings: Any
) -> None:
    settings.SIGNIN_RATE_LIMIT = (0.001, 2)
    client = Client()
    sign_in(client, "/login/", "ada", "wrong")
    sign_in(client, "/admin/login/", "ada", "wrong")
    assert THROTTLED in sign_in(client, "/admin/login/", "ada", "pw-ada-123").content.decode()
    assert THROTTLED in sign_in(client, "/login/", "ada", "pw-ada-123").content.decode()


def test_a_rate_of_zero_turns_the_throttle_off(personas: Personas, settings: Any) -> None:
    settings.SIGNIN_RATE_LIMIT = (0, 0)
    client = Client()
    for _ in range(15):
        assert THROTTLED not in sign_in(client, "/login/", "olive", "wrong").content.decode()
    assert sign_in(client, "/login/", "olive", "pw-olive-123").status_code == 302


def test_racing_attempts_get_no_more_than_the_burst_past_the_throttle(
    tx_personas: Personas, settings: Any
) -> None:
    """Twelve sign-ins at once on one account, each on its own thread and connection: the bucket
    in Redis lets exactly the burst through to the password check, however they interleave."""
    settings.SIGNIN_RATE_LIMIT = (0.001, 5)

    def attempt(i: int) -> bool:
        response = sign_in(Client(), "/login/", "olive", "wrong-guess")
        assert response.status_code == 200
        return THROTTLED in response.content.decode()

    throttled = run_threads(12, attempt)
    assert throttled.count(False) == 5 and throttled.count(True) == 7
