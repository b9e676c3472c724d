"""The Celery app: sweeps on beat, outbound hooks on the worker. Broker: Redis."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from types import FrameType
from typing import Any

from celery import Celery
from celery.beat import PersistentScheduler, Service
from celery.signals import beat_init
from kombu.utils.functional import retry_over_time

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "switchboard.settings")

app = Celery("switchboard")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

# Set by `manage.py serve` for its beat: a file the beat writes once its scheduler is made. Until
# then a stop signal would reach Celery's stop handler mid-construction (queues/.../serve.py).
BEAT_READY_FILE_ENV = "SWITCHBOARD_BEAT_READY_FILE"


class SweepScheduler(PersistentScheduler):
    """Celery's own scheduler (the schedule kept in a shelve file) that a stop signal ends only
    between its steps: at once if the beat only waits, else as soon as the tick, the send or the
    schedule's save under way is done (``stop_between_ticks``)."""

    stop_requested = False
    ticking = False  # Service.start is in its loop, whose exceptions end in its ``finally``

    def tick(self, *args: Any, **kwargs: Any) -> float:
        self.ticking = True
        if self.stop_requested:
            raise SystemExit()
        interval: float = super().tick(*args, **kwargs)
        if self.stop_requested:
            raise SystemExit()  # before the sleep: Service.start's own exit closes the store
        return interval


def stop_between_ticks(service: Service) -> None:
    """Replace Celery's stop handler (``install_sync_handler``) for ``service``'s beat.

    Celery's handler closes the store and the broker connection from inside the signal handler,
    wherever the beat was, then raises SystemExit there. Signalled while the beat waited on
    Redis for a task it was sending, redis-py's own cleanup met the closed connection ("I/O
    operation on closed file"), that error took the SystemExit's place, the beat logged it and
    ticked on with its store closed ("invalid operation on closed shelf"; CI on 4ed98fa).

    This handler closes nothing. Where the beat only waits (asleep until its next tick, in
    Service.start's own frame; or between tries to reach a broker that is down, in kombu's
    ``retry_over_time``, up to ``broker_connection_max_retries`` of them), it exits at once.
    Anywhere else the scheduler is told, and its tick ends the beat once it is done. Either way
    Service.start's ``finally`` saves and closes the store, once."""
    scheduler = service.scheduler
    if not isinstance(scheduler, SweepScheduler):
        return  # another scheduler (``--scheduler``): Celery's handler stays
    waiting = {type(service).start.__code__, retry_over_time.__code__}

    def on_stop(signum: int, frame: FrameType | None) -> None:
        if scheduler.stop_requested:
            return  # a second signal: the first one's stop is under way
        scheduler.stop_requested = True
        if scheduler.ticking and frame is not None and frame.f_code in waiting:
            raise SystemExit()

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, on_stop)


@beat_init.connect
def _on_beat_init(sender: Service, **kwargs: object) -> None:
    """Sent by ``Service.start`` once ``service.scheduler`` is made, just before its first tick:
    from here a stop signal finds the scheduler whole. The ready file says so to the launcher."""
    if threading.current_thread() is threading.main_thread():  # not a worker's embedded beat
        stop_between_ticks(sender)
    path = os.environ.get(BEAT_READY_FILE_ENV)
    if path:
        Path(path).touch()
