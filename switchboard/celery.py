"""The Celery app: sweeps on beat, outbound hooks on the worker. Broker: Redis."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "switchboard.settings")

app = Celery("switchboard")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
