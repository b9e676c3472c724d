"""Sign-in throttling for the console's and the admin's sign-in forms.

Every attempt to sign in as an account takes a token from that account's bucket
(``SIGNIN_RATE_LIMIT``, shared by every process through Redis, ``switchboard.core.ratelimit``)
before the password is checked: ten tries at once, then one every twenty seconds by default. A
refused attempt checks nothing and says when to try again, so guessing a password costs an
attacker time whichever address they come from. The bucket is the account's, not the client's:
behind the TLS proxy production runs with, every client would share one address. The bucket is
keyed by the name as typed (case-folded), whether or not such an account exists, so the answer
tells nothing about which names do. Redis unreachable: the limiter admits (it protects, it is not
a correctness guarantee).
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.conf import settings
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.forms import AuthenticationForm

from switchboard.core import ratelimit


class _Throttled:
    """Mixed into Django's sign-in forms: the account's token first, then Django's checks."""

    cleaned_data: dict[str, Any]

    def clean(self) -> dict[str, Any]:
        username = self.cleaned_data.get("username")
        if username:
            rate, burst = settings.SIGNIN_RATE_LIMIT
            key = f"signin:{str(username).casefold()}"
            allowed, retry_after = ratelimit.take(key, rate=rate, burst=burst)
            if not allowed:
                raise forms.ValidationError(
                    "Too many sign-in attempts for this account: try again in %(seconds)d s.",
                    code="throttled",
                    params={"seconds": retry_after},
                )
        return super().clean()  # type: ignore[misc]


class SignInForm(_Throttled, AuthenticationForm):
    pass


class AdminSignInForm(_Throttled, AdminAuthenticationForm):
    pass
