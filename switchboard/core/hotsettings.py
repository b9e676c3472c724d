"""Settings the claim cycle reads on every claim and completion, kept between reads.

``django.conf.settings.NAME`` is a Python call on every read (``LazyObject.__getattribute__``):
a bare claim cycle read three, a few percent of its client's instructions (issue 12). A value
read here is kept until ``override_settings`` (or anything sending ``setting_changed``) changes
that setting; a value assigned to ``settings`` directly, without that signal, is not seen.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.signals import setting_changed

_kept: dict[str, Any] = {}


def setting(name: str) -> Any:
    """``getattr(settings, name)``, read once until the setting changes."""
    try:
        return _kept[name]
    except KeyError:
        value = _kept[name] = getattr(settings, name)
        return value


def _forget(*, setting: str, **kwargs: Any) -> None:
    _kept.pop(setting, None)


setting_changed.connect(_forget, dispatch_uid="switchboard.core.hotsettings")
