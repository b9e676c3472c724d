"""Celery tasks: thin callers of the sweeps, and the ready-hook delivery."""

from __future__ import annotations

import logging

from celery import shared_task

from queues import hooks, services

log = logging.getLogger(__name__)


@shared_task(name="queues.tasks.reap_expired", ignore_result=True)
def reap_expired() -> int:
    return services.reap_expired()


@shared_task(name="queues.tasks.requeue_due_retries", ignore_result=True)
def requeue_due_retries() -> int:
    return services.requeue_due_retries()


@shared_task(
    name="queues.tasks.deliver_ready_hook",
    ignore_result=True,
    bind=True,
    max_retries=5,
    autoretry_for=(hooks.HookDeliveryError,),
    retry_backoff=5,
    retry_backoff_max=300,
)
def deliver_ready_hook(
    self: object, endpoint_id: str, queue: str, todo_id: str | None, reason: str
) -> None:
    hooks.deliver_ready(endpoint_id=endpoint_id, queue=queue, todo_id=todo_id, reason=reason)
