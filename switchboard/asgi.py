"""The ASGI application: Django, with one thread hop per request instead of many.

Django's own ASGI handler runs a synchronous view through the async middleware chain: every
sync-only middleware adds a sync/async hop, the request signals add two more, and each request's
sync work runs in a thread made for that request (asgiref's ``ThreadSensitiveContext``). Measured
on the agent path (issue 11) that bridging cost more CPU than the view. So a request for a
synchronous view (every page, the REST API and MCP's POSTs) is served whole, middleware included,
by Django's synchronous handler in a long-lived thread of a fixed pool: one hop there, one back.
Only requests for ``async def`` views (the console's live stream, event streams) take Django's
async path, where they can wait without holding a thread.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import io
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Coroutine, Iterator, Mapping
from typing import Any

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "switchboard.settings")
django.setup(set_prefix=False)  # as django.core.asgi.get_asgi_application does

from django.conf import settings  # noqa: E402  (after Django is set up)
from django.core import signals  # noqa: E402
from django.core.exceptions import RequestAborted  # noqa: E402
from django.core.handlers.asgi import (  # noqa: E402
    ASGIHandler,
    ASGIRequest,
    get_script_prefix,
)
from django.core.handlers.base import BaseHandler  # noqa: E402
from django.core.handlers.exception import (  # noqa: E402
    convert_exception_to_response,
    response_for_exception,
)
from django.db import close_old_connections  # noqa: E402
from django.http import FileResponse  # noqa: E402
from django.http.request import split_domain_port, validate_host  # noqa: E402
from django.http.response import HttpResponseBase  # noqa: E402
from django.urls import Resolver404, ResolverMatch, get_resolver, set_script_prefix  # noqa: E402
from django.utils.log import log_response  # noqa: E402
from django.utils.module_loading import import_string  # noqa: E402

from switchboard import api as agent_api  # noqa: E402
from switchboard import mcp, requestdb  # noqa: E402
from switchboard import middleware as edge  # noqa: E402
from switchboard.core import availability, verbs  # noqa: E402
from switchboard.core.errors import InvalidArgument  # noqa: E402
from switchboard.core.http import API_BODY_LIMIT, FORM_TYPES, media_type  # noqa: E402
from switchboard.core.tokens import bearer_token  # noqa: E402
from switchboard.core.validation import check_text  # noqa: E402
from switchboard.pgpool import base as pgpool  # noqa: E402

ARRIVED = "switchboard.arrived"

log = logging.getLogger(__name__)


class _Workers:
    """A fixed set of long-lived threads serving callables for the event loop.

    What ``loop.run_in_executor`` does, with less per call (issue 11): no concurrent.futures
    Future chained to an asyncio one, no condition variable; one lock released to wake a
    thread, one ``call_soon_threadsafe`` back. Each thread keeps its database connection
    (CONN_MAX_AGE, or an agent request's kept one: ``switchboard.requestdb``) and nothing is
    started per request.

    The thread that became idle last is woken first (a stack), and a thread that finishes while
    work waits takes it without sleeping: at N requests at once the same N threads serve, so
    their kept database connections (and PostgreSQL's backends behind them) stay few and warm.
    A thread idle ``idle_after()`` seconds calls ``on_idle`` (gives its kept connection back):
    asked each time a thread becomes idle, so a window set later (the pool's, which the server's
    threads follow) holds from the next wait on.
    """

    def __init__(
        self,
        threads: int,
        name: str,
        *,
        on_idle: Callable[[], None] | None = None,
        idle_after: Callable[[], float] = lambda: 1.0,
    ) -> None:
        self._lock = threading.Lock()
        self._jobs: collections.deque[Any] = collections.deque()
        self._idle: list[_Worker] = []  # the last to become idle at the end
        self._on_idle = on_idle
        self._idle_after = idle_after
        for n in range(threads):
            worker = _Worker()
            threading.Thread(
                target=self._serve, args=(worker,), name=f"{name}_{n}", daemon=True
            ).start()

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        job = (future, loop, fn, args)
        with self._lock:
            worker = self._idle.pop() if self._idle else None
            if worker is None:
                self._jobs.append(job)
            else:
                worker.job = job
        if worker is not None:
            worker.wake.release()
        return await future

    def _serve(self, worker: _Worker) -> None:
        job = self._next(worker)
        while True:
            future, loop, fn, args = job
            outcome: tuple[Any, BaseException | None]
            try:
                outcome = (fn(*args), None)
            except BaseException as exc:  # handed to the awaiting request, as an executor does
                outcome = (None, exc)
            # Idle again (or on to waiting work) before the answer goes back, so the request
            # that answer lets the loop send next finds this thread on top of the stack.
            job = self._next(worker, wait=False)
            loop.call_soon_threadsafe(_settle, future, *outcome)
            del future, fn, args, outcome  # nothing of this request kept while idle
            if job is None:
                job = self._next(worker, listed=True)

    def _next(self, worker: _Worker, *, wait: bool = True, listed: bool = False) -> Any:
        """The next job: one waiting, else (listed idle) one given to ``worker``, or None
        without ``wait``."""
        if not listed:
            with self._lock:
                if self._jobs:
                    return self._jobs.popleft()
                self._idle.append(worker)
        if not wait:
            return None
        if not worker.wake.acquire(timeout=self._idle_after()):
            if self._on_idle is not None:
                try:
                    self._on_idle()
                except Exception:
                    log.warning("a worker thread's idle hook failed", exc_info=True)
            worker.wake.acquire()
        job, worker.job = worker.job, None
        return job


class _Worker:
    """A thread of ``_Workers``: ``wake`` is released when ``job`` was given to it."""

    __slots__ = ("job", "wake")

    def __init__(self) -> None:
        self.job: Any = None
        self.wake = threading.Lock()
        self.wake.acquire()


def _settle(future: asyncio.Future[Any], result: Any, exc: BaseException | None) -> None:
    if future.cancelled():  # the client went away meanwhile
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(result)


class _SyncChain(BaseHandler):
    """Django's synchronous request handling (the WSGI handler's) through ``middleware``.

    With ``resolved``, a path's URL match is kept once resolved (the agents' few paths, each
    request resolving the same one again cost a few percent of its CPU)."""

    def __init__(self, middleware: list[str], *, resolved: bool = False) -> None:
        super().__init__()
        self._resolved = resolved
        # BaseHandler.load_middleware(is_async=False) for a given list (it reads MIDDLEWARE):
        # every middleware here is sync-capable, so no adapting is needed.
        self._view_middleware: list[Any] = []
        self._template_response_middleware: list[Any] = []
        self._exception_middleware: list[Any] = []
        handler = convert_exception_to_response(self._get_response)  # type: ignore[attr-defined]
        for path in reversed(middleware):
            instance = import_string(path)(handler)
            if hasattr(instance, "process_view"):
                self._view_middleware.insert(0, instance.process_view)
            if hasattr(instance, "process_template_response"):
                self._template_response_middleware.append(instance.process_template_response)
            if hasattr(instance, "process_exception"):
                self._exception_middleware.append(instance.process_exception)
            handler = convert_exception_to_response(instance)
        self._middleware_chain = handler

    def resolve_request(self, request: Any) -> ResolverMatch:
        if not self._resolved or hasattr(request, "urlconf"):
            return super().resolve_request(request)
        match = _resolve(request.path_info)
        request.resolver_match = match
        return match


# The script prefix each request thread last set (``OneHopHandler._respond``).
_thread_prefix = threading.local()


@functools.lru_cache(maxsize=1024)
def _resolve(path: str) -> ResolverMatch:
    """The URL match of an agent path (raises Resolver404 as Django does; not kept then)."""
    return get_resolver().resolve(path)


class _Answer:
    """A whole response made without an HttpResponse: status, encoded headers, body."""

    __slots__ = ("body", "headers", "status")

    def __init__(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body


class AgentPath:
    """The agents' plain POSTs, served without Django's request handling (issue 11).

    A POST to ``/api/v1/agent/<verb>`` with a bearer token, no query and a JSON body that
    passes the verb's input model runs the verb's direct operation (``switchboard.api``:
    ``agent_for_verb``, ``verbs.call_json``) in a pool thread with no HttpRequest, middleware chain
    or HttpResponse: on the agent path those cost about a third of a request's CPU, more than
    the claim itself. A POST to ``/mcp/<slug>`` with no query goes to ``mcp_view`` with its
    request but without the middleware chain (a ``subscriptions/listen`` stream included: its
    body is sent as Django's path sends it). What the chain did for such a request is done
    here, in the same order, and ``tests/api/test_agent_path.py`` compares every answer, headers included, with
    the one Django's handler gives:

    * the work of Django's request signals' receivers (``switchboard.requestdb``: a
      connection the request left clean is kept for the thread's next request, anything else
      goes back to the pool as Django gives it back);
    * ``ALLOWED_HOSTS`` (``CommonMiddleware``), ``SECURE_SSL_REDIRECT`` and HSTS
      (``SecurityMiddleware``), the request deadline (``SecurityHeadersMiddleware``);
    * the headers ``AGENT_MIDDLEWARE`` adds, in the order it adds them;
    * refusals through the API's own exception handlers (``api.on_exception``), logged as
      Django logs a 4xx/5xx; on MCP the edge check of the path, and an exception out of the
      view answered as the chain answers it (an outage 503, else Django's 500).

    Anything else (a query, another content type, a body the verb's input refuses, a host
    not allowed, a request SSL redirection would send elsewhere, a setting this path does not
    mirror) returns None before anything is charged or changed, and the request takes Django's
    path, which answers it as before.
    """

    def __init__(self, handler_class: type) -> None:
        self.handler_class = handler_class
        self.enabled = bool(settings.AGENT_FAST_PATH) and not (
            settings.PREPEND_WWW
            or settings.DISALLOWED_USER_AGENTS
            or settings.USE_X_FORWARDED_HOST
            or settings.FORCE_SCRIPT_NAME
            or list(settings.AGENT_MIDDLEWARE) != _AGENT_MIDDLEWARE_MIRRORED
        )
        self.allowed_hosts = list(settings.ALLOWED_HOSTS)
        if settings.DEBUG and not self.allowed_hosts:
            self.allowed_hosts = [".localhost", "127.0.0.1", "[::1]"]
        self.hosts: dict[str, bool] = {}
        self.proxy_ssl: tuple[str, str] | None = settings.SECURE_PROXY_SSL_HEADER
        self.redirect = settings.SECURE_SSL_REDIRECT
        self.redirect_exempt = [re.compile(r) for r in settings.SECURE_REDIRECT_EXEMPT]
        hsts = ""
        if settings.SECURE_HSTS_SECONDS:
            hsts = f"max-age={settings.SECURE_HSTS_SECONDS}"
            if settings.SECURE_HSTS_INCLUDE_SUBDOMAINS:
                hsts += "; includeSubDomains"
            if settings.SECURE_HSTS_PRELOAD:
                hsts += "; preload"
        self.hsts = hsts
        policy = settings.SECURE_REFERRER_POLICY
        if policy and isinstance(policy, str):
            policy = ",".join(v.strip() for v in policy.split(","))
        elif policy:
            policy = ",".join(policy)
        self.referrer_policy = policy
        self.nosniff = settings.SECURE_CONTENT_TYPE_NOSNIFF
        self.opener_policy = settings.SECURE_CROSS_ORIGIN_OPENER_POLICY
        self.frame_options = getattr(settings, "X_FRAME_OPTIONS", "DENY").upper()
        self.request = requestdb.AgentRequest(handler_class)
        self._verbs: dict[str, verbs.VerbSpec] | None = None
        self._mcp_slugs: dict[str, str | None] = {}  # an MCP path's slug, None: not served here
        # An answer's headers before and after its Content-Length (``_plain_headers``).
        self._plain_heads: dict[
            tuple[str, bool, bool], tuple[list[tuple[bytes, bytes]], list[tuple[bytes, bytes]]]
        ] = {}

    def route(self, scope: dict[str, Any]) -> verbs.VerbSpec | str | None:
        """What a request names when this path may serve it: a verb (REST) or an MCP slug.
        On the loop, so cheap: the resolved paths are kept."""
        if not self.enabled or scope["method"] != "POST" or scope.get("query_string"):
            return None
        if self._verbs is None:
            self._verbs = self._resolved_verbs()
        path = _path(scope)
        spec = self._verbs.get(path)
        if spec is not None or not path.startswith("/mcp/"):
            return spec
        try:
            return self._mcp_slugs[path]
        except KeyError:
            pass
        slug = self._mcp_slug(path)
        if len(self._mcp_slugs) < 1024:  # the endpoints' paths; not every path a client tries
            self._mcp_slugs[path] = slug
        return slug

    def _mcp_slug(self, path: str) -> str | None:
        try:
            match = _resolve(path)
        except Resolver404:
            return None
        if match.func is not mcp.mcp_view or self._exempt(path):
            return None
        slug: str = match.kwargs["slug"]
        return slug

    def _exempt(self, path: str) -> bool:
        return any(p.search(path.lstrip("/")) for p in self.redirect_exempt)

    def _resolved_verbs(self) -> dict[str, verbs.VerbSpec]:
        """Each verb's path, kept only while it resolves to that verb's direct view."""
        found = {}
        for name, spec in verbs.load_verbs().items():
            path = f"/api/v1/agent/{name}"
            try:
                match = get_resolver().resolve(path)
            except Resolver404:
                continue
            if getattr(match.func, "agent_verb_spec", None) is spec and not self._exempt(path):
                found[path] = spec
        return found

    def serve(self, scope: dict[str, Any], body: bytes, spec: verbs.VerbSpec) -> _Answer | None:
        """In a pool thread: the verb's answer, or None for Django's path (nothing done)."""
        meta = _meta(scope)
        token = bearer_token(meta.get("HTTP_AUTHORIZATION", ""))
        if token is None or len(body) > API_BODY_LIMIT:
            return None
        kind = media_type(meta.get("CONTENT_TYPE", ""))
        if kind != "application/json" and body:
            return None
        secure = self._admit(scope, meta)
        if secure is None:
            return None
        data = agent_api.verb_input(spec, body)
        if data is None:
            return None
        _set_prefix(scope)
        # Django's request signals, done without dispatch; the thread's database connection
        # is kept for its next request when left clean (switchboard/requestdb.py says why).
        mirrored = self.request.started(scope)
        try:
            with availability.request_deadline(scope.get(ARRIVED, time.monotonic())):
                try:
                    actor = agent_api.agent_for_verb(token, spec)
                    content = verbs.call_json(actor, spec, data)
                except Exception as exc:
                    return self._refusal(scope, body, exc, secure)
            return _Answer(200, self._plain_headers(_JSON, secure, True, len(content)), content)
        finally:
            self.request.finished(mirrored)

    def _plain_headers(
        self, content_type: str, secure: bool, private: bool, length: int
    ) -> list[tuple[bytes, bytes]]:
        """The encoded headers of an answer with no headers of its own but its Content-Type
        (``_finish``'s, a verb's JSON answer, an MCP ``Reply``): made once per Content-Type,
        ``secure`` and ``private`` (they depend on nothing else but the settings read at
        start); only Content-Length is made per answer."""
        key = (content_type, secure, private)
        parts = self._plain_heads.get(key)
        if parts is None:
            typed = {"content-type": ("Content-Type", content_type)} if content_type else {}
            headers = self._finish(typed, 0, secure, private=private)
            at = [name for name, _ in headers].index("Content-Length")
            encoded = _encoded(headers)
            parts = (encoded[:at], encoded[at + 1 :])
            if len(self._plain_heads) < 64:  # the few types this code answers with
                self._plain_heads[key] = parts
        before, after = parts
        return [*before, (b"Content-Length", b"%d" % length), *after]

    def serve_mcp(
        self, scope: dict[str, Any], body: bytes, slug: str
    ) -> _Answer | HttpResponseBase | None:
        """In a pool thread: ``mcp_view``'s answer, or None for Django's path (nothing done).

        ``mcp.respond`` reads the request through ``_McpRequest`` (no HttpRequest) and answers
        with an ``mcp.Reply`` (no HttpResponse); a successful one goes out as it is. A refusal,
        a stream and anything raised are answered through an HttpRequest and an HttpResponse,
        as before (issue 11: making both and reading the answer back cost about a quarter of
        an MCP tool call's CPU, more than the JSON-RPC handling)."""
        meta = _meta(scope)
        if media_type(meta.get("CONTENT_TYPE", "")) in FORM_TYPES:
            return None  # the edge check would read its fields
        secure = self._admit(scope, meta)
        if secure is None:
            return None
        lean = _McpRequest(scope, meta, body)
        _set_prefix(scope)
        # As the REST path: the thread keeps a connection the request left clean for its next
        # request (switchboard/requestdb.py); an answer that goes out as an HttpResponse sends
        # request_finished when it is closed, and that gives the connection back.
        mirrored = self.request.started(scope)
        answer: mcp.Reply | HttpResponseBase
        inner = True  # the answer passed the inner middleware (frame options, length)
        try:
            with availability.request_deadline(scope.get(ARRIVED, time.monotonic())):
                try:
                    # The edge check (check_request_text): here no query and no form, so the path.
                    check_text(scope["path"], "path")
                except InvalidArgument as exc:
                    answer = edge.edge_refusal(lean.django(), exc)
                    inner = False  # refused by SecurityHeadersMiddleware, before them
                else:
                    try:
                        incoming = lean if _plain_size(meta, body) else lean.django()
                        answer = mcp.respond(incoming, slug)
                    except Exception as exc:  # as the chain answers it
                        request = lean.django()
                        answer = edge.outage_refusal(request, exc) or response_for_exception(
                            request, exc
                        )
            if not isinstance(answer, mcp.Reply) or answer.status >= 400:
                response = mcp.as_response(answer)
                if response.status_code >= 400:
                    log_response(
                        "%s: %s",
                        response.reason_phrase,
                        scope["path"],
                        response=response,  # type: ignore[arg-type]  # as BaseHandler passes it
                        request=lean.django(),
                    )
        except BaseException:
            self.request.finished(mirrored)
            raise
        if isinstance(answer, mcp.Reply) and answer.status < 400 and not answer.headers:
            encoded = self._plain_headers(
                answer.content_type, secure, "HTTP_AUTHORIZATION" in meta, len(answer.content)
            )
            self.request.finished(mirrored)  # as response.close()
            return _Answer(answer.status, encoded, answer.content)
        if isinstance(answer, mcp.Reply) and answer.status < 400:
            headers = (
                {"content-type": ("Content-Type", answer.content_type)}
                if answer.content_type
                else {}
            )
            for name, value in answer.headers:
                headers[name.lower()] = (name, value)
            finished = self._finish(
                headers, len(answer.content), secure, private="HTTP_AUTHORIZATION" in meta
            )
            self.request.finished(mirrored)  # as response.close()
            return _Answer(answer.status, _encoded(finished), answer.content)
        # As BaseHandler.get_response and OneHopHandler._respond: the request is closed with
        # the response, which sends request_finished.
        response._resource_closers.append(lean.django().close)  # type: ignore[attr-defined]
        response._handler_class = self.handler_class  # type: ignore[attr-defined]
        headers = {name.lower(): (name, value) for name, value in response.items()}
        finished = self._finish(
            headers,
            None if response.streaming or not inner else len(response.content),  # type: ignore[attr-defined]
            secure,
            private="HTTP_AUTHORIZATION" in meta,
            frame_exempt=not inner or getattr(response, "xframe_options_exempt", False),
        )
        if response.streaming:
            for name, value in finished:
                response[name] = value
            close_old_connections()  # as _respond: the body is produced later
            return response
        response.close()
        if response.cookies:
            for name, value in finished:
                response[name] = value
            return response
        return _Answer(response.status_code, _encoded(finished), response.content)  # type: ignore[attr-defined]

    def _refusal(self, scope: dict[str, Any], body: bytes, exc: Exception, secure: bool) -> _Answer:
        """The API's answer to ``exc``, as ``agent_verb_direct`` gives it, logged as Django's
        handler logs it."""
        request = ASGIRequest(scope, io.BytesIO(body))
        response = agent_api.api.on_exception(request, exc)
        if response.status_code >= 400:
            log_response(
                "%s: %s", response.reason_phrase, request.path, response=response, request=request
            )
        content = response.content
        headers = {name.lower(): (name, value) for name, value in response.items()}
        finished = self._finish(headers, len(content), secure)
        return _Answer(response.status_code, _encoded(finished), content)

    def _finish(
        self,
        headers: dict[str, tuple[str, str]],
        length: int | None,
        secure: bool,
        *,
        private: bool = True,
        frame_exempt: bool = False,
    ) -> list[tuple[str, str]]:
        """What ``AGENT_MIDDLEWARE`` adds to a response, innermost first: X-Frame-Options,
        Content-Length (not on a stream), ``SecurityHeadersMiddleware``'s (no-store when the
        request carried an Authorization header), then ``SecurityMiddleware``'s."""
        if not frame_exempt:
            headers.setdefault("x-frame-options", ("X-Frame-Options", self.frame_options))
        if length is not None:
            headers.setdefault("content-length", ("Content-Length", str(length)))
        headers.setdefault(
            "content-security-policy", ("Content-Security-Policy", edge.CONTENT_SECURITY_POLICY)
        )
        if private:
            headers.setdefault("cache-control", ("Cache-Control", "no-store"))
        headers.setdefault("x-content-type-options", ("X-Content-Type-Options", "nosniff"))
        headers.setdefault("referrer-policy", ("Referrer-Policy", "same-origin"))
        if self.hsts and secure:
            headers.setdefault(
                "strict-transport-security", ("Strict-Transport-Security", self.hsts)
            )
        if self.nosniff:
            headers.setdefault("x-content-type-options", ("X-Content-Type-Options", "nosniff"))
        if self.referrer_policy:
            headers.setdefault("referrer-policy", ("Referrer-Policy", self.referrer_policy))
        if self.opener_policy:
            headers.setdefault(
                "cross-origin-opener-policy", ("Cross-Origin-Opener-Policy", self.opener_policy)
            )
        return list(headers.values())

    def _admit(self, scope: dict[str, Any], meta: dict[str, str]) -> bool | None:
        """Whether the request is secure, or None when the chain would refuse or redirect it
        before its view (a host not allowed, plain HTTP under SECURE_SSL_REDIRECT)."""
        host = meta.get("HTTP_HOST")
        if host is None or not self._host_allowed(host):
            return None
        secure = self._secure(scope, meta)
        if self.redirect and not secure:
            return None
        return secure

    def _host_allowed(self, host: str) -> bool:
        """``HttpRequest.get_host``'s check, remembered per Host value."""
        allowed = self.hosts.get(host)
        if allowed is None:
            domain, _ = split_domain_port(host)
            allowed = bool(domain and validate_host(domain, self.allowed_hosts))
            if len(self.hosts) < 1024:
                self.hosts[host] = allowed
        return allowed

    def _secure(self, scope: dict[str, Any], meta: dict[str, str]) -> bool:
        """``HttpRequest.is_secure``."""
        if self.proxy_ssl:
            header, secure_value = self.proxy_ssl
            value = meta.get(header)
            if value is not None:
                return value.split(",", 1)[0].strip() == secure_value
        return (scope.get("scheme") or "http") == "https"


def _plain_size(meta: dict[str, str], body: bytes) -> bool:
    """Whether the body is within API_BODY_LIMIT and Django's DATA_UPLOAD_MAX_MEMORY_SIZE,
    declared and read: then ``HttpRequest.body`` is the body, as ``_McpRequest.body`` is. A body
    past either bound is read through an HttpRequest, whose refusals it takes."""
    bound = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    bound = API_BODY_LIMIT if bound is None else min(bound, API_BODY_LIMIT)
    declared = meta.get("CONTENT_LENGTH", "")
    if declared and not (declared.isdigit() and int(declared) <= bound):
        return False
    return len(body) <= bound


class _MetaHeaders(Mapping[str, str]):
    """``HttpRequest.headers`` read from META as ``_meta`` makes it: a name in any case, with
    hyphens (Content-Type and Content-Length unprefixed, as Django keeps them)."""

    __slots__ = ("meta",)

    def __init__(self, meta: dict[str, str]) -> None:
        self.meta = meta

    @staticmethod
    @functools.lru_cache(maxsize=256)
    def _key(name: str) -> str:
        key = name.upper().replace("-", "_")
        return key if key in ("CONTENT_TYPE", "CONTENT_LENGTH") else "HTTP_" + key

    def __getitem__(self, name: str) -> str:
        return self.meta[self._key(name)]

    def get(self, name: str, default: Any = None) -> Any:
        return self.meta.get(self._key(name), default)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self._key(name) in self.meta

    def __iter__(self) -> Iterator[str]:
        for key in self.meta:
            if key.startswith("HTTP_"):
                yield key[5:].replace("_", "-").title()
            elif key in ("CONTENT_TYPE", "CONTENT_LENGTH"):
                yield key.replace("_", "-").title()

    def __len__(self) -> int:
        return sum(1 for _ in self)


class _McpRequest:
    """What ``mcp.respond`` reads of an MCP POST (``mcp.Incoming``), from the scope, without an
    HttpRequest; ``django()`` makes the ASGIRequest (once) where Django's own code takes one
    (a refusal, an exception, the log). Made only for a request ``AgentPath._admit`` admitted:
    its host is allowed, so ``get_host()`` is the Host header, as ``HttpRequest.get_host``
    gives it (USE_X_FORWARDED_HOST turns the lean path off)."""

    __slots__ = ("_django", "body", "headers", "meta", "method", "scope")

    def __init__(self, scope: dict[str, Any], meta: dict[str, str], body: bytes) -> None:
        self.scope = scope
        self.meta = meta
        self.body = body
        self.method: str | None = scope["method"].upper()
        self.headers = _MetaHeaders(meta)
        self._django: ASGIRequest | None = None

    def get_host(self) -> str:
        return self.meta["HTTP_HOST"]

    def django(self) -> ASGIRequest:
        if self._django is None:
            self._django = ASGIRequest(self.scope, io.BytesIO(self.body))
        return self._django


# The agent middleware whose work AgentPath does itself (settings.AGENT_MIDDLEWARE); another
# list turns the path off.
_AGENT_MIDDLEWARE_MIRRORED = [
    "django.middleware.security.SecurityMiddleware",
    "switchboard.middleware.SecurityHeadersMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]


_JSON = "application/json"


def _encoded(headers: list[tuple[str, str]]) -> list[tuple[bytes, bytes]]:
    return [(name.encode("ascii"), value.encode("latin1")) for name, value in headers]


@functools.lru_cache(maxsize=256)
def _meta_key(raw: bytes) -> str | None:
    """A header's name as ``ASGIRequest`` keys it in META, or None (a name with "_" is dropped);
    remembered, as the same few names come with every request."""
    name = raw.decode("latin1")
    if "_" in name:
        return None
    if name == "content-length":
        return "CONTENT_LENGTH"
    if name == "content-type":
        return "CONTENT_TYPE"
    return "HTTP_" + name.upper().replace("-", "_")


def _meta(scope: dict[str, Any]) -> dict[str, str]:
    """The request's headers as ``ASGIRequest`` puts them in META (names with "_" dropped,
    repeated headers joined)."""
    meta: dict[str, str] = {}
    for raw, raw_value in scope.get("headers", ()):
        key = _meta_key(raw)
        if key is None:
            continue
        value = raw_value.decode("latin1")
        meta[key] = f"{meta[key]},{value}" if key in meta else value
    return meta


def _set_prefix(scope: dict[str, Any]) -> None:
    prefix = get_script_prefix(scope)
    if getattr(_thread_prefix, "value", None) != prefix:
        # Set once per thread and prefix: asgiref's Local made setting it on every request
        # cost ~2 % of an agent request's GIL time (issue 11). Nothing else sets it in
        # these threads.
        set_script_prefix(prefix)
        _thread_prefix.value = prefix


class OneHopHandler(ASGIHandler):
    """Django's ASGI handler, serving synchronous views in one hop to a fixed thread pool: the
    agents' paths (``AGENT_PATH_PREFIXES``) to ``agent_threads`` threads of their own, every
    other path to ``threads``."""

    def __init__(self, threads: int, agent_threads: int) -> None:
        super().__init__()
        self.sync_chain = _SyncChain(settings.MIDDLEWARE)
        # The agents' paths skip the console's middleware (settings.AGENT_MIDDLEWARE says why).
        self.agent_chain = _SyncChain(settings.AGENT_MIDDLEWARE, resolved=True)
        self.agent_prefixes = tuple(settings.AGENT_PATH_PREFIXES)

        # Apart, so that neither the console's load nor the agents' takes the other's threads,
        # and the agents' few (settings.AGENT_THREADS says why). Each thread gives back the
        # connection it kept once idle (switchboard/requestdb.py) for the pool's idle window,
        # read as it is then: one window for the hook, the kept connection and the pool's check.
        def pool(n: int, name: str) -> _Workers:
            return _Workers(
                n, name, on_idle=requestdb.give_back, idle_after=lambda: pgpool.IDLE_CHECK_SECONDS
            )

        self.workers = pool(threads, "django")
        self.agent_workers = pool(agent_threads, "agent")
        self.agent_path = AgentPath(self.__class__)

    def _is_agent(self, path: str) -> bool:
        """Whether ``path`` (without the script prefix) is one of the agents' paths: their
        threads and their middleware chain."""
        return path.startswith(self.agent_prefixes)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await super().__call__(scope, receive, send)
        elif (route := self.agent_path.route(scope)) is not None:
            await self.handle_agent(scope, receive, send, route)
        elif not _async_view(path := _path(scope)):
            workers = self.agent_workers if self._is_agent(path) else self.workers
            await self.handle_in_thread(scope, receive, send, workers)
        else:
            await super().__call__(scope, receive, send)

    async def handle_agent(
        self, scope: dict[str, Any], receive: Any, send: Any, route: verbs.VerbSpec | str
    ) -> None:
        """An agent's POST: ``AgentPath`` in one pool thread, Django's path when it declines
        (in the same thread, the body read once)."""
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        try:
            answer = await self.agent_workers.run(self._respond_agent, scope, body_file, route)
            if isinstance(answer, _Answer):
                await send(
                    {
                        "type": "http.response.start",
                        "status": answer.status,
                        "headers": answer.headers,
                    }
                )
                await send({"type": "http.response.body", "body": answer.body})
            else:
                await self._send(answer, receive, send)
        finally:
            body_file.close()

    def _respond_agent(
        self, scope: dict[str, Any], body_file: Any, route: verbs.VerbSpec | str
    ) -> _Answer | HttpResponseBase:
        body = body_file.getvalue() if isinstance(body_file, io.BytesIO) else None
        answer: _Answer | HttpResponseBase | None = None
        if body is None:
            pass  # spooled to a file: past any bound, Django's path refuses it
        elif isinstance(route, str):
            answer = self.agent_path.serve_mcp(scope, body, route)
        else:
            answer = self.agent_path.serve(scope, body, route)
        return answer if answer is not None else self._respond(scope, body_file)

    async def read_body(self, receive: Any) -> Any:
        """The body in memory: an agent's (or a form's) is a few hundred bytes, and Django's
        spooled temporary file cost more than the read. Spooled to disk past Django's
        in-memory upload size, as Django does."""
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise RequestAborted()
            chunk = message.get("body", b"")
            if chunk:
                chunks.append(chunk)
                size += len(chunk)
                if size > settings.FILE_UPLOAD_MAX_MEMORY_SIZE:
                    return await self._spool(chunks, message, receive)
            if not message.get("more_body", False):
                return io.BytesIO(b"".join(chunks))

    async def _spool(self, chunks: list[bytes], message: dict[str, Any], receive: Any) -> Any:
        async def replay() -> dict[str, Any]:
            nonlocal message
            if chunks:
                return {"type": "http.request", "body": chunks.pop(0), "more_body": True}
            if not message.get("more_body", False):
                return {"type": "http.request", "body": b"", "more_body": False}
            message = await receive()
            return message

        return await super().read_body(replay)

    async def handle_in_thread(
        self, scope: dict[str, Any], receive: Any, send: Any, workers: _Workers
    ) -> None:
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        try:
            response = await workers.run(self._respond, scope, body_file)
            await self._send(response, receive, send)
        finally:
            body_file.close()

    async def _send(self, response: HttpResponseBase, receive: Any, send: Any) -> None:
        if response.streaming:
            await self._stream(response, receive, send)
        elif response.cookies:
            await self.send_response(response, send)
        else:
            await _send_whole(response, send)

    def _respond(self, scope: dict[str, Any], body_file: Any) -> HttpResponseBase:
        """The whole synchronous request in one pool thread: signals, middleware, view."""
        _set_prefix(scope)
        signals.request_started.send(sender=self.__class__, scope=scope)
        request, error_response = self.create_request(scope, body_file)
        if request is None:
            assert error_response is not None  # create_request gives one or the other
            response: HttpResponseBase = error_response
        else:
            chain = self.agent_chain if self._is_agent(request.path_info) else self.sync_chain
            response = chain.get_response(request)
            response._handler_class = self.__class__  # type: ignore[attr-defined]
        if not response.streaming:
            # The content is in memory: closing now sends request_finished, which returns this
            # thread's database connection, before the bytes go out.
            response.close()
        else:
            # The body is produced later, in another thread (a synchronous iterator) or on the
            # loop (an asynchronous one): this thread's part of the request is over, so its
            # connection goes back now rather than when the thread's next request ends.
            close_old_connections()
        return response

    async def _stream(self, response: HttpResponseBase, receive: Any, send: Any) -> None:
        """Send a streamed body until it ends or the client goes away, then close it.

        The client's ``http.disconnect`` is listened for throughout: uvicorn drops what is sent
        after a disconnect without an error, so an event stream whose agent hung up would run
        (and keep its doorbell subscription) for ever. On a disconnect the sending is cancelled:
        an asynchronous body (an event stream) is cancelled where it waits, so its ``finally``
        detaches it; a synchronous one (the ledger CSV, a static file) stops producing.

        A synchronous body is produced in one pool thread from start to end, a few chunks ahead
        of the client, and closed there (``request_finished`` then closes that thread's
        connection, which a database-backed iterator opened). Django's ASGI handler would read
        it whole into memory on an executor thread and leave that thread's connection open.
        """
        if isinstance(response, FileResponse):
            response.block_size = self.chunk_size  # as ASGIHandler.run_get_response does
        if response.is_async:  # type: ignore[attr-defined]
            try:
                await _until_disconnect(self.send_response(response, send), receive)
            finally:
                # Cancelled while it waited in ``send`` rather than in the body, the view's
                # generator would stay suspended (its ``finally`` unrun) until collected.
                await _aclose(response)
                # request_finished, in a pool thread (where connections live).
                await self.workers.run(response.close)
            return
        feed = _Feed(asyncio.get_running_loop())
        producing = asyncio.ensure_future(self.workers.run(_produce, response, feed))
        try:
            await _until_disconnect(_send_feed(response, feed, send), receive)
        finally:
            feed.stop()
            # The producer closes the response; wait for it, so that nothing of the request
            # (its connection above all) outlives it.
            await asyncio.shield(producing)


async def _send_whole(response: HttpResponseBase, send: Any) -> None:
    """A response whose content is in memory, as ASGIHandler.send_response sends it (the same
    headers, bytes unchanged), in two messages rather than chunks."""
    headers = [
        (
            header.encode("ascii") if isinstance(header, str) else bytes(header),
            value.encode("latin1") if isinstance(value, str) else bytes(value),
        )
        for header, value in response.items()
    ]
    await send({"type": "http.response.start", "status": response.status_code, "headers": headers})
    await send({"type": "http.response.body", "body": response.content})  # type: ignore[attr-defined]


# How many chunks of a synchronous body are produced ahead of the client (backpressure: a slow
# client holds the producing thread, never the whole body in memory).
STREAM_AHEAD = 8
_END = object()


class _Feed:
    """Chunks of a synchronous body, handed from the producing thread to the loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.chunks: asyncio.Queue[Any] = asyncio.Queue()
        self.room = threading.Semaphore(STREAM_AHEAD)
        self.stopped = threading.Event()

    def put(self, item: Any) -> None:
        """From the producing thread."""
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody reads any more
            self.loop.call_soon_threadsafe(self.chunks.put_nowait, item)

    def stop(self) -> None:
        """From the loop: the client is gone or the body was sent; the producer ends."""
        self.stopped.set()
        self.room.release()  # wakes a producer waiting for room


def _produce(response: HttpResponseBase, feed: _Feed) -> None:
    """In a pool thread: iterate the body into ``feed``, then close it in this same thread."""
    try:
        for chunk in response:
            feed.room.acquire()
            if feed.stopped.is_set():
                break
            feed.put(chunk)
        else:
            feed.put(_END)
    except BaseException as exc:  # handed to the loop, which raises it as the body's error
        feed.put(exc)
    finally:
        # Closes the iterator (a generator's finally, a server-side cursor) and sends
        # request_finished, which closes this thread's connection.
        response.close()


async def _send_feed(response: HttpResponseBase, feed: _Feed, send: Any) -> None:
    """The response from ``feed``: the chunks ready at each moment are sent as one message."""
    await send(
        {
            "type": "http.response.start",
            "status": response.status_code,
            "headers": _headers(response),
        }
    )
    while True:
        parts = [await feed.chunks.get()]
        while not feed.chunks.empty():
            parts.append(feed.chunks.get_nowait())
        end = False
        body = []
        for part in parts:
            if part is _END:
                end = True
            elif isinstance(part, BaseException):
                raise part
            else:
                body.append(part)
                feed.room.release()
        if body:
            await send({"type": "http.response.body", "body": b"".join(body), "more_body": True})
        if end:
            await send({"type": "http.response.body"})
            return


async def _until_disconnect(sending: Coroutine[Any, Any, None], receive: Any) -> None:
    """Run ``sending`` until it ends or the client disconnects (then cancel it)."""
    sender = asyncio.ensure_future(sending)
    listener = asyncio.ensure_future(_disconnected(receive))
    try:
        await asyncio.wait((sender, listener), return_when=asyncio.FIRST_COMPLETED)
    finally:
        listener.cancel()
        if not sender.done():
            sender.cancel()
        # A cancelled body is the client's doing, not an error; anything else is raised.
        with contextlib.suppress(asyncio.CancelledError):
            await sender


async def _aclose(response: HttpResponseBase) -> None:
    """Close the view's asynchronous iterator (StreamingHttpResponse keeps it as ``_iterator``;
    closing a finished generator does nothing)."""
    aclose = getattr(getattr(response, "_iterator", None), "aclose", None)
    if aclose is not None:
        await aclose()


async def _disconnected(receive: Any) -> None:
    """Return when the client is gone (the request body has been read: only that can come)."""
    while (await receive())["type"] != "http.disconnect":
        pass


def _headers(response: HttpResponseBase) -> list[tuple[bytes, bytes]]:
    """The response's headers and cookies, as ASGIHandler.send_response encodes them."""
    headers = [
        (
            header.encode("ascii") if isinstance(header, str) else bytes(header),
            value.encode("latin1") if isinstance(value, str) else bytes(value),
        )
        for header, value in response.items()
    ]
    for cookie in response.cookies.values():
        headers.append((b"Set-Cookie", cookie.output(header="").encode("ascii").strip()))
    return headers


def _path(scope: dict[str, Any]) -> str:
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    return path.removeprefix(root) if root else path


@functools.lru_cache(maxsize=4096)
def _async_view(path: str) -> bool:
    """Whether the view at ``path`` is ``async def`` (served on Django's async path)."""
    try:
        match = get_resolver().resolve(path)
    except Resolver404:
        return False
    return asyncio.iscoroutinefunction(match.func)


handler = OneHopHandler(threads=settings.WEB_THREADS, agent_threads=settings.AGENT_THREADS)


async def application(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Django, with each request's arrival stamped before it can queue for a worker thread
    (the request deadline counts from here: switchboard.core.availability)."""
    if scope["type"] == "lifespan":
        await _lifespan(receive, send)
        return
    scope[ARRIVED] = time.monotonic()
    if scope["type"] == "http" and (scope["method"] == "GET" or scope["path"].startswith("/mcp/")):
        await _ending_streams_cleanly(scope, receive, send)  # what may answer with a stream
        return
    await handler(scope, receive, send)


async def _ending_streams_cleanly(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """``handler``, with a stream the server cancels at its stop ended as a stream ends.

    uvicorn cancels what is still running only at a graceful stop, past its bound (an event
    stream never ends by itself). Cancelled mid-stream, the response lost its closing chunk (a
    client read a truncated body, not an end) and the log got "Exception in ASGI application"
    for each stream. Here the last chunk goes out and the cancellation ends the request; the
    client reconnects, to another process, with Last-Event-ID."""
    streaming = False
    task = asyncio.current_task()
    if task is not None:
        _STREAMS.add(task)

    async def tracked(message: dict[str, Any]) -> None:
        nonlocal streaming
        if message["type"] == "http.response.body":
            streaming = bool(message.get("more_body"))
        await send(message)

    try:
        try:
            await handler(scope, receive, tracked)
        except asyncio.CancelledError:
            if not streaming:
                raise
        if streaming:  # cancelled, here or under Django's handler (which may swallow it)
            with contextlib.suppress(Exception):
                await send({"type": "http.response.body", "body": b"", "more_body": False})
    finally:
        if task is not None:
            _STREAMS.discard(task)


# The requests running in ``_ending_streams_cleanly``: uvicorn goes on to the lifespan's
# shutdown right after it cancels them, and the process ends after that, so the shutdown lets
# them write their last chunk first.
_STREAMS: set[asyncio.Task[Any]] = set()
STREAM_END_SECONDS = 1.0


async def _lifespan(receive: Any, send: Any) -> None:
    """The server's start and graceful stop. At the stop, after the last request, this
    process's buffered counter increments go to Redis: uvicorn ends a process it stopped on
    SIGTERM by raising that signal again with the default action, so no atexit hook runs and
    the flusher thread's last quarter second of increments would be lost (the counters would
    fall behind the database for good)."""
    from switchboard.core import counters

    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            if _STREAMS:
                await asyncio.wait(set(_STREAMS), timeout=STREAM_END_SECONDS)
            await asyncio.to_thread(counters.flush_at_exit)
            await send({"type": "lifespan.shutdown.complete"})
            return
