"""The ready hook: an HTTP POST to the endpoint's notify URL, signed per Standard Webhooks.

Headers ``webhook-id``, ``webhook-timestamp`` and ``webhook-signature: v1,<base64 HMAC-SHA256 of
"id.timestamp.body" under the endpoint's secret>`` (the key is the base64 after ``whsec_``; during a
rotation's overlap a second signature under the previous secret follows, space-separated).
Delivered by Celery on a queue of its own (``hooks``, so the sweeps never wait behind a slow
receiver): ``HOOK_ATTEMPTS`` attempts ``HOOK_RETRY_SECONDS`` apart, each given
``HOOK_TIMEOUT_SECONDS`` in all (connect, send and the answer's head), through the SSRF guard
(``queues.hookguard``); when the last fails the endpoint is marked (``hook_failed_at``,
``hook_error``). Checked against pauses and deferral again at delivery time (fail open).

The body (``ready_body``): ``{"type": "todo.ready", "endpoint": slug, "queue", "todo": id,
"title", "reason"}``, ``reason`` one of ``wakes.REASONS``: ``created``, ``requeued``,
``released``, ``reaped``, ``reopened``, ``resumed`` (work became claimable), ``stalled`` (a claim
the endpoint holds went quiet for half its lease) or ``waiting`` (a reminder from the doorbell
heartbeat: claimable work still waits; no new edge).
"""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import hmac
import http.client
import json
import logging
import socket
import threading
import time
import uuid
from urllib.parse import urlsplit

from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.utils import timezone

from queues import hookguard, metrics, ring_gate
from queues.models import Endpoint, EndpointState, Todo, TodoState

log = logging.getLogger(__name__)


class HookDeliveryError(Exception):
    """A failed attempt; ``todo_id``: the todo its body named, for the retries to name again
    (one message, one body: a reminder's todo is chosen once, not at each attempt)."""

    todo_id: str | None = None


def sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """``v1,<signature>`` per Standard Webhooks: the key is the secret after ``whsec_``,
    base64-decoded as receivers' libraries decode it (padding added, other characters skipped,
    so secrets minted before the base64 form verify the same way)."""
    key = base64.b64decode(secret.removeprefix("whsec_") + "==")
    signed = f"{msg_id}.{timestamp}.".encode() + body
    digest = hmac.new(key, signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def signatures(endpoint: Endpoint, msg_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` header: one signature per secret in force, space-separated as
    Standard Webhooks allows, so during a rotation's overlap a receiver holding either the old or
    the new secret finds its own."""
    secrets = [endpoint.notify_secret]
    until = endpoint.notify_secret_previous_until
    if endpoint.notify_secret_previous and until is not None and until > timezone.now():
        secrets.append(endpoint.notify_secret_previous)
    return " ".join(sign(secret, msg_id, timestamp, body) for secret in secrets)


def ready_body(endpoint: Endpoint, queue: str, todo: Todo | None, reason: str) -> dict[str, object]:
    return {
        "type": "todo.ready",
        "endpoint": endpoint.slug,
        "queue": queue,
        "todo": str(todo.id) if todo else None,
        "title": todo.title if todo else None,
        "reason": reason,
    }


def _todo_named(
    endpoint: Endpoint, queue: str, todo_id: str | None, reason: str, *, resent: bool = False
) -> Todo | None:
    """The todo the hook names: for ``stalled`` the claimed todo, still claimed; else the given
    todo while pending, or the queue identity's oldest pending todo. ``resent``: a retry of a
    message that named ``todo_id``, which names that todo or nothing (the work was taken: no
    message), never another under the same ``webhook-id``."""
    if reason == "stalled":
        return Todo.objects.filter(pk=todo_id, state=TodoState.CLAIMED).first() if todo_id else None
    todo = None
    if todo_id:
        todo = Todo.objects.filter(pk=todo_id, state=TodoState.PENDING).first()
    if todo is None and not (resent and todo_id):
        todo = (
            Todo.objects.filter(endpoint=endpoint, queue=queue, state=TodoState.PENDING)
            .order_by("created_at", "id")
            .first()
        )
    return todo


def deliver_ready(
    *,
    endpoint_id: str,
    queue: str,
    todo_id: str | None,
    reason: str,
    msg_id: str | None = None,
    resent: bool = False,
) -> bool:
    """One delivery attempt; raises HookDeliveryError for Celery to retry. ``msg_id``: the
    delivery's ``webhook-id``, the same in each of its attempts (Standard Webhooks: a receiver
    drops a resent message by it); a new one when not given. ``resent``: a later attempt, whose
    ``todo_id`` is the one the first named (``_todo_named``)."""
    endpoint = Endpoint.objects.filter(pk=endpoint_id, state=EndpointState.ACTIVE).first()
    if endpoint is None or not endpoint.notify_url:
        return False
    if reason != "stalled":  # a stall concerns a claim already held: no gate applies
        may_ring, _, _ = ring_gate.check(endpoint.id, queue)
        if not may_ring:
            return False
    todo = _todo_named(endpoint, queue, todo_id, reason, resent=resent)
    if todo is None:
        return False
    body = json.dumps(ready_body(endpoint, queue, todo, reason)).encode()
    msg_id = msg_id or f"msg_{uuid.uuid4().hex}"
    ts = int(time.time())
    headers = {
        "content-type": "application/json",
        "webhook-id": msg_id,
        "webhook-timestamp": str(ts),
        "webhook-signature": signatures(endpoint, msg_id, ts, body),
    }
    try:
        status = post(endpoint.notify_url, body, headers)
    except SoftTimeLimitExceeded:
        raise  # Celery's backstop, said by the task (``hook_tasks``)
    except Exception as exc:
        # Whatever ends the attempt (the network, the guard, a URL http.client cannot send,
        # stored before the checks that refuse it now) is a failed delivery: retried, then
        # shown on the endpoint, never a task error nobody sees.
        metrics.notify_hook("failed")
        failed = HookDeliveryError(str(exc) or type(exc).__name__)
        failed.todo_id = str(todo.id)
        raise failed from exc
    if status >= 300:
        metrics.notify_hook("failed")
        failed = HookDeliveryError(f"hook answered {status}")
        failed.todo_id = str(todo.id)
        raise failed
    metrics.notify_hook("delivered")
    if endpoint.hook_failed_at is not None:
        Endpoint.objects.filter(pk=endpoint.pk).update(hook_failed_at=None, hook_error="")
    return True


def post(url: str, body: bytes, headers: dict[str, str]) -> int:
    """POST ``body`` to ``url`` through the SSRF guard; the response status. No redirects are
    followed (a redirect could lead anywhere the guard did not see).

    The whole attempt (connect, TLS handshake, send, the response's status line and headers) has
    ``HOOK_TIMEOUT_SECONDS``: http.client's timeout bounds each socket read only, so a receiver
    answering a byte every few seconds would hold the worker without limit. The connection is
    made within what is left of the deadline; after it, a timer shuts the socket down under
    whatever read or write is waiting, and the attempt fails with ``TimeoutError``."""
    limit = settings.HOOK_TIMEOUT_SECONDS
    deadline = time.monotonic() + limit
    parts = urlsplit(url)
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = cls(parts.hostname or "", parts.port, timeout=limit)
    # http.client opens its socket through this attribute; HTTPS then wraps it, checking the
    # certificate against the URL's host name.
    conn._create_connection = functools.partial(hookguard.connect, deadline=deadline)  # type: ignore[attr-defined]

    def expire() -> None:
        if conn.sock is not None:  # None while connecting: the connect has the deadline itself
            with contextlib.suppress(OSError):
                # The plain socket's shutdown, for HTTPS too: it wakes the waiting read.
                socket.socket.shutdown(conn.sock, socket.SHUT_RDWR)

    timer = threading.Timer(limit, expire)
    timer.daemon = True
    timer.start()
    try:
        conn.connect()
        if time.monotonic() >= deadline:  # it passed as the connection was made
            raise TimeoutError
        path = parts.path or "/"
        conn.request("POST", f"{path}?{parts.query}" if parts.query else path, body, headers)
        status = conn.getresponse().status
        if time.monotonic() >= deadline:
            # The timer shut the socket under a head still arriving: http.client took the end
            # of the stream for the end of the headers. Not an answer within the deadline.
            raise TimeoutError
        return status
    except (OSError, http.client.HTTPException) as exc:
        if time.monotonic() >= deadline:
            raise TimeoutError(f"the hook did not answer within {limit} s") from exc
        raise
    finally:
        timer.cancel()
        timer.join()  # so it never shuts down a socket closed below (its number reused)
        conn.close()


def record_failure(*, endpoint_id: str, error: str) -> None:
    """The last attempt failed: mark the endpoint so the console and the API show it."""
    Endpoint.objects.filter(pk=endpoint_id).update(
        hook_failed_at=timezone.now(), hook_error=error[:500]
    )
    metrics.notify_hook("gave_up")
