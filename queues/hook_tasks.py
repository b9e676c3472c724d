"""The ready hook's Celery task, apart from the sweeps' tasks (``queues.tasks``) so that the wakes,
which enqueue it, need not import the services that ring them.

It runs on the ``hooks`` queue (``CELERY_TASK_ROUTES``), which ``manage.py serve`` gives a worker
of its own: the receivers' URLs are the endpoint owners' to choose, so a slow one must never hold
the worker that reaps and requeues. Each attempt has ``HOOK_TIMEOUT_SECONDS`` in all
(``hooks.post``); Celery's time limits are the backstop should anything else hang (name
resolution, the database)."""

from __future__ import annotations

import logging

from celery import Task, shared_task
from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings

from queues import hooks

log = logging.getLogger(__name__)


@shared_task(
    name="queues.tasks.deliver_ready_hook",
    ignore_result=True,
    bind=True,
    max_retries=settings.HOOK_ATTEMPTS - 1,
    soft_time_limit=settings.HOOK_TASK_SOFT_TIME_LIMIT_SECONDS,
    time_limit=settings.HOOK_TASK_SOFT_TIME_LIMIT_SECONDS + 5,
)
def deliver_ready_hook(
    self: Task, endpoint_id: str, queue: str, todo_id: str | None, reason: str
) -> None:
    """At most ``HOOK_ATTEMPTS`` attempts, ``HOOK_RETRY_SECONDS`` apart; after the last the
    endpoint is marked failed (a ring is a hint: a receiver that is down misses it, and the
    doorbell's reminders ring again later)."""
    # A retry is the same task (its id kept): every attempt of a delivery is one message.
    task_id = self.request.id
    msg_id = f"msg_{str(task_id).replace('-', '')}" if task_id else None
    try:
        _attempt(
            endpoint_id=endpoint_id,
            queue=queue,
            todo_id=todo_id,
            reason=reason,
            msg_id=msg_id,
            resent=self.request.retries > 0,
        )
    except hooks.HookDeliveryError as exc:
        if self.request.retries >= self.max_retries:
            log.warning("ready hook for %s gave up: %s", endpoint_id, exc)
            hooks.record_failure(endpoint_id=endpoint_id, error=str(exc))
            return
        # The retry names the todo this attempt's body named: one message, one body.
        again = (endpoint_id, queue, exc.todo_id or todo_id, reason)
        raise self.retry(args=again, exc=exc, countdown=settings.HOOK_RETRY_SECONDS) from exc


def _attempt(
    *,
    endpoint_id: str,
    queue: str,
    todo_id: str | None,
    reason: str,
    msg_id: str | None,
    resent: bool,
) -> None:
    """One delivery attempt; reaching Celery's soft time limit counts as a failed one."""
    try:
        hooks.deliver_ready(
            endpoint_id=endpoint_id,
            queue=queue,
            todo_id=todo_id,
            reason=reason,
            msg_id=msg_id,
            resent=resent,
        )
    except SoftTimeLimitExceeded as exc:
        raise hooks.HookDeliveryError("the delivery exceeded its time limit") from exc
