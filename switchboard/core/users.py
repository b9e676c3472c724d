"""Who a username names: one lookup for the API, the CLI and the services."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.base_user import AbstractBaseUser


def user_named(username: str) -> AbstractBaseUser | None:
    """The user whose USERNAME_FIELD is ``username``, or None."""
    model = get_user_model()
    return model._default_manager.filter(**{model.USERNAME_FIELD: username}).first()
