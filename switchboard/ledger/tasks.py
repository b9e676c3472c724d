"""The ledger's beat task: verify the chain and keep the result for the pages."""

from __future__ import annotations

from celery import shared_task

from switchboard.ledger import chain


@shared_task(name="ledger.tasks.verify", ignore_result=True)
def verify() -> bool:
    return chain.check().ok
