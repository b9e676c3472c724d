"""Celery tasks: thin callers of the admission sweeps (schedules in settings.CELERY_BEAT_SCHEDULE)."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from admission import services


@shared_task(name="admission.tasks.reopen", ignore_result=True)
def reopen() -> dict[str, Any]:
    """One todo_ready per budgeted queue identity that became admitted and has work."""
    return services.reopen_sweep().as_dict()


@shared_task(name="admission.tasks.retention", ignore_result=True)
def retention() -> int:
    """Prune window counters older than WINDOW_RETENTION_DAYS."""
    return services.window_retention()
