"""A Celery beat scheduler for tests: ours (``SweepScheduler``), held for a while once its store
is open, before it sets the schedule up. A new store's file is written when it is opened, so for
that while the beat's schedule file is there but its scheduler is half made.
Each opening and closing of a store is appended to the file ``SLOW_BEAT_RECORD`` names."""

from __future__ import annotations

import os
import shelve
import time
from typing import Any

from switchboard.celery import SweepScheduler

HOLD_SECONDS = 3.0


def _record(event: str) -> None:
    with open(os.environ["SLOW_BEAT_RECORD"], "a") as record:
        record.write(event + "\n")


class SlowScheduler(SweepScheduler):
    def _open_schedule(self) -> shelve.Shelf[Any]:
        store: shelve.Shelf[Any] = super()._open_schedule()
        _record("opened")
        time.sleep(HOLD_SECONDS)
        return store

    def close(self) -> None:
        super().close()
        _record("closed")
