"""Who a username names, and whether a session still signs its user in: the lookups the API,
the CLI, the services and the console's streams share."""

from __future__ import annotations

from importlib import import_module
from types import SimpleNamespace
from typing import Any

from django.conf import settings
from django.contrib import auth
from django.contrib.auth import get_user_model
from django.contrib.auth.base_user import AbstractBaseUser


def user_named(username: str) -> AbstractBaseUser | None:
    """The user whose USERNAME_FIELD is ``username``, or None."""
    model = get_user_model()
    return model._default_manager.filter(**{model.USERNAME_FIELD: username}).first()


def still_signed_in(session_key: str | None, user_id: Any) -> bool:
    """Whether the session ``session_key`` still signs in the same active user, as Django's own
    check of a request would find (a sign-out anywhere, the session's expiry, a password change
    or the account's deactivation end it). For a stream, which outlives its request's check."""
    if not session_key:
        return False
    store = import_module(settings.SESSION_ENGINE).SessionStore(session_key=session_key)
    user = auth.get_user(SimpleNamespace(session=store))  # type: ignore[arg-type]
    return bool(user.is_authenticated and user.pk == user_id and user.is_active)
