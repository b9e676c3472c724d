"""A real Celery worker inside the test process, on the test run's own Redis broker."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from celery.contrib.testing.worker import start_worker
from django.conf import settings

from switchboard.celery import app


@contextmanager
def real_worker(**options: Any) -> Iterator[Any]:
    """``start_worker`` (the solo pool, no ping) with ``options``, stopped when the block ends.

    Celery's embedded worker sets the root logger's level to its own (ERROR) and leaves it so.
    It is put back here: otherwise every later test of this process hears no warning, and a test
    reading one fails only when it follows a worker's test (as on a pytest-xdist worker, which
    runs the files in another order than a single process does).
    """
    app.conf.broker_url = settings.REDIS_URL
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    try:
        with start_worker(
            app, pool="solo", perform_ping_check=False, shutdown_timeout=10, **options
        ) as worker:
            yield worker
    finally:
        root.setLevel(level)
        root.handlers[:] = handlers
