"""The Celery app: sweeps on beat, outbound hooks on the worker. Broker: Redis."""

from __future__ import annotations

import os
from pathlib import Path

from celery import Celery
from celery.signals import beat_init

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "switchboard.settings")

app = Celery("switchboard")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

# Set by `manage.py serve` for its beat: a file the beat writes once its scheduler is made. Until
# then a stop signal would reach Celery's stop handler mid-construction (queues/.../serve.py).
BEAT_READY_FILE_ENV = "SWITCHBOARD_BEAT_READY_FILE"


@beat_init.connect
def _say_the_beat_is_set_up(sender: object, **kwargs: object) -> None:
    """Sent by ``Service.start`` once ``service.scheduler`` is made: from here a stop signal
    closes that scheduler's store (Celery's ``install_sync_handler``) before the beat exits."""
    path = os.environ.get(BEAT_READY_FILE_ENV)
    if path:
        Path(path).touch()
