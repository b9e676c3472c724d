"""Admin forms whose save is a service call.

The admin saves a form after it is valid, in ``ModelAdmin.save_model``, where a refusal has no
page to land on: a ``ValidationError`` raised there is a 500. So the write happens here instead,
last in the form's validation (after the fields, ``clean`` and the model's own checks): the
service's refusal becomes an error beside the field it names (or above the form), and since the
service refused, nothing was written. ``save_model`` only takes what the write made.
"""

from __future__ import annotations

from typing import Any, ClassVar

from django import forms
from django.contrib import admin
from django.db import transaction
from django.http import HttpRequest

from switchboard.core.errors import DomainError


class ServiceModelForm(forms.ModelForm):
    """A model form that, once valid, calls ``write`` (its service) in a savepoint and turns a
    ``DomainError`` into the form's error on the field it names."""

    # The services' names of fields that the form calls otherwise (``rps`` for ``rate_limit_rps``).
    service_fields: ClassVar[dict[str, str]] = {}
    # The admin's request (who acts), set on the class ``ModelAdmin.get_form`` makes for it.
    request: HttpRequest | None = None
    written: Any = None

    def write(self) -> Any:
        """Make the change through its service; the answer is kept as ``written``."""
        raise NotImplementedError

    def full_clean(self) -> None:
        super().full_clean()
        if not self.is_bound or self.errors:
            return
        try:
            with transaction.atomic():
                self.written = self.write()
        except DomainError as exc:
            name = str(exc.details.get("field") or "")
            name = self.service_fields.get(name, name)
            self.add_error(name if name in self.fields else None, exc.message)


class ServiceFormAdmin(admin.ModelAdmin):
    """A model admin whose forms are ``ServiceModelForm``s: each form class it makes knows the
    request it serves (``get_form`` makes a class per request)."""

    def get_form(
        self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any
    ) -> Any:
        form: Any = super().get_form(request, obj, change=change, **kwargs)
        form.request = request
        return form
