"""The ready hook: an HTTP POST to the endpoint's notify URL, signed per Standard Webhooks.

Headers ``webhook-id``, ``webhook-timestamp`` and ``webhook-signature: v1,<base64 HMAC-SHA256 of
"id.timestamp.body" under the endpoint's secret>``. Delivered by Celery with bounded retries;
checked against pauses and deferral again at delivery time (fail open).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import time
import urllib.request
import uuid

from queues import metrics
from queues.models import Endpoint, EndpointState, Todo, TodoState

log = logging.getLogger(__name__)
TIMEOUT_SECONDS = 10


class HookDeliveryError(Exception):
    pass


def sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    key = secret.removeprefix("whsec_").encode()
    signed = f"{msg_id}.{timestamp}.".encode() + body
    digest = hmac.new(key, signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def ready_body(endpoint: Endpoint, queue: str, todo: Todo | None, reason: str) -> dict[str, object]:
    return {
        "type": "todo.ready",
        "endpoint": endpoint.slug,
        "queue": queue,
        "todo": str(todo.id) if todo else None,
        "title": todo.title if todo else None,
        "reason": reason,
    }


def deliver_ready(*, endpoint_id: str, queue: str, todo_id: str | None, reason: str) -> bool:
    from queues import wakes

    endpoint = Endpoint.objects.filter(pk=endpoint_id, state=EndpointState.ACTIVE).first()
    if endpoint is None or not endpoint.notify_url:
        return False
    may_ring, _, _ = wakes._gate(endpoint.id, queue)
    if not may_ring:
        return False
    todo = None
    if todo_id:
        todo = Todo.objects.filter(pk=todo_id, state=TodoState.PENDING).first()
    if todo is None:  # name the oldest pending todo of the queue identity
        todo = (
            Todo.objects.filter(endpoint=endpoint, queue=queue, state=TodoState.PENDING)
            .order_by("created_at", "id")
            .first()
        )
    if todo is None:
        return False
    body = json.dumps(ready_body(endpoint, queue, todo, reason)).encode()
    msg_id = f"msg_{uuid.uuid4().hex}"
    ts = int(time.time())
    request = urllib.request.Request(
        endpoint.notify_url,
        data=body,
        method="POST",
        headers={
            "content-type": "application/json",
            "webhook-id": msg_id,
            "webhook-timestamp": str(ts),
            "webhook-signature": sign(endpoint.notify_secret, msg_id, ts, body),
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_SECONDS) as response:
            if response.status >= 300:
                raise HookDeliveryError(f"hook answered {response.status}")
    except OSError as exc:
        metrics.notify_hook("failed")
        raise HookDeliveryError(str(exc)) from exc
    except HookDeliveryError:
        metrics.notify_hook("failed")
        raise
    metrics.notify_hook("delivered")
    return True
