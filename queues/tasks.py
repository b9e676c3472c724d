"""Celery tasks: thin callers of the sweeps, and the ready-hook delivery."""

from __future__ import annotations

import logging

from celery import shared_task

from queues import services

# Registered with Celery here too: autodiscovery imports each app's tasks module only.
from queues.hook_tasks import deliver_ready_hook as deliver_ready_hook

log = logging.getLogger(__name__)


@shared_task(name="queues.tasks.reap_expired", ignore_result=True)
def reap_expired() -> int:
    return services.swept("reap_expired", services.reap_expired)


@shared_task(name="queues.tasks.requeue_due_retries", ignore_result=True)
def requeue_due_retries() -> int:
    return services.swept("requeue_due_retries", services.requeue_due_retries)


@shared_task(name="queues.tasks.remind_waiting", ignore_result=True)
def remind_waiting() -> int:
    return services.swept("remind_waiting", services.remind_waiting)


@shared_task(name="queues.tasks.ring_stalled", ignore_result=True)
def ring_stalled() -> int:
    return services.swept("ring_stalled", services.ring_stalled)
