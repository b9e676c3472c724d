"""Celery tasks: thin callers of the sweeps, and the ready-hook delivery."""

from __future__ import annotations

import logging

from celery import Task, shared_task
from django.conf import settings

from queues import hooks, services

log = logging.getLogger(__name__)


@shared_task(name="queues.tasks.reap_expired", ignore_result=True)
def reap_expired() -> int:
    return services.reap_expired()


@shared_task(name="queues.tasks.requeue_due_retries", ignore_result=True)
def requeue_due_retries() -> int:
    return services.requeue_due_retries()


@shared_task(name="queues.tasks.remind_waiting", ignore_result=True)
def remind_waiting() -> int:
    return services.remind_waiting()


@shared_task(name="queues.tasks.ring_stalled", ignore_result=True)
def ring_stalled() -> int:
    return services.ring_stalled()


@shared_task(
    name="queues.tasks.deliver_ready_hook",
    ignore_result=True,
    bind=True,
    max_retries=settings.HOOK_ATTEMPTS - 1,
)
def deliver_ready_hook(
    self: Task, endpoint_id: str, queue: str, todo_id: str | None, reason: str
) -> None:
    """At most ``HOOK_ATTEMPTS`` attempts, ``HOOK_RETRY_SECONDS`` apart; after the last the
    endpoint is marked failed (a ring is a hint: a receiver that is down misses it, and the
    doorbell's reminders ring again later)."""
    try:
        hooks.deliver_ready(endpoint_id=endpoint_id, queue=queue, todo_id=todo_id, reason=reason)
    except hooks.HookDeliveryError as exc:
        if self.request.retries >= self.max_retries:
            log.warning("ready hook for %s gave up: %s", endpoint_id, exc)
            hooks.record_failure(endpoint_id=endpoint_id, error=str(exc))
            return
        raise self.retry(exc=exc, countdown=settings.HOOK_RETRY_SECONDS) from exc
