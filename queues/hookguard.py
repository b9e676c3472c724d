"""The SSRF guard on outbound hooks: a notify URL may only reach public addresses.

An endpoint owner chooses the URL the server POSTs to, so without a guard the server would call
into its own network for them (the cloud metadata service, PostgreSQL's host, an admin port on
loopback). Every address the host name resolves to must be public: loopback, private, link-local
(which holds the metadata address 169.254.169.254), shared, multicast, reserved and unspecified
addresses are refused, for IPv4 and IPv6 alike (an IPv4-mapped IPv6 address and a 6to4 address in
2002::/16 are each judged as the IPv4 address they carry).

The check runs twice: when the URL is set (``check_url``: an http(s) URL, its scheme in any case and
stored in lower case, with a host, a port from 1 to 65535 and no user name or password, which the
hook would not send; the caller's error names ``notify_url``)
and at connect time (``connect``), on the addresses the connection actually uses, so a name that
resolved to a public address when it was saved and resolves to 127.0.0.1 now (DNS rebinding) is
refused too. ``HOOK_ALLOWED_NETWORKS`` lists networks allowed anyway (a receiver inside the
operator's own network; the tests' local receiver).

Name resolution has a deadline too: ``getaddrinfo`` takes no timeout, and a resolver that does
not answer would hold the caller (a hook worker; the web request that sets a URL) for as long
as the system's resolver retries. The lookup runs on a small thread pool of the process's own
and the caller waits only until its deadline; a lookup past it is abandoned to finish (or
time out) on its pool thread.
"""

from __future__ import annotations

import concurrent.futures
import ipaddress
import os
import socket
import threading
import time
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class UnsafeHookAddress(Exception):
    """The hook's host is, or resolves to, an address the server may not call."""


def _allowed_networks() -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    return [ipaddress.ip_network(n, strict=False) for n in settings.HOOK_ALLOWED_NETWORKS]


def refusal(address: IPAddress) -> str | None:
    """Why the server may not call ``address`` (None when it may)."""
    if isinstance(address, ipaddress.IPv6Address):
        # Both carry an IPv4 address that a host or a relay may route to (6to4: 2002:7f00:1::
        # is 127.0.0.1 to a host with a 6to4 interface).
        address = address.ipv4_mapped or address.sixtofour or address
    if any(address in network for network in _allowed_networks()):
        return None
    for kind in ("loopback", "link_local", "private", "multicast", "reserved", "unspecified"):
        if getattr(address, f"is_{kind}"):
            return kind.replace("_", "-")
    if not address.is_global:  # shared address space (100.64/10) and the like
        return "non-public"
    return None


# Lookups a deadline abandoned keep their thread until the resolver gives up; the pool's size
# bounds how many threads a resolver that never answers can take.
RESOLVER_THREADS = 4
_resolver: tuple[int, concurrent.futures.ThreadPoolExecutor] | None = None
_resolver_lock = threading.Lock()


def _resolver_pool() -> concurrent.futures.ThreadPoolExecutor:
    """The process's lookup pool, made in the process that uses it (a Celery worker forks from
    a parent whose pool threads it would not have)."""
    global _resolver
    with _resolver_lock:
        if _resolver is None or _resolver[0] != os.getpid():
            pool = concurrent.futures.ThreadPoolExecutor(
                max_workers=RESOLVER_THREADS, thread_name_prefix="hook-resolve"
            )
            _resolver = (os.getpid(), pool)
        return _resolver[1]


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _lookup(host: str, port: int, timeout: float | None) -> list[Any]:
    if timeout is None or _is_address(host):  # an address literal needs no resolver
        return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    if timeout <= 0:
        raise TimeoutError(f"no time left to resolve {host}")
    lookup = _resolver_pool().submit(socket.getaddrinfo, host, port, type=socket.SOCK_STREAM)
    try:
        return lookup.result(timeout=timeout)
    except concurrent.futures.TimeoutError:
        lookup.cancel()  # still queued behind lookups that hang: never run it
        raise TimeoutError(f"the host {host} did not resolve within {timeout:.2g} s") from None


def resolve(host: str, port: int, *, timeout: float | None = None) -> list[IPAddress]:
    """Every address ``host`` resolves to, each checked; raises UnsafeHookAddress if any is
    refused (a name with one public and one private address is refused: the connection could
    take either), or if it does not resolve within ``timeout`` seconds (None: the system
    resolver's own limits)."""
    try:
        infos = _lookup(host, port, timeout)
    except TimeoutError as exc:
        raise UnsafeHookAddress(str(exc)) from exc
    except OSError as exc:
        raise UnsafeHookAddress(f"the host {host} does not resolve") from exc
    addresses = list(dict.fromkeys(ipaddress.ip_address(info[4][0]) for info in infos))
    _check(host, addresses)
    return addresses


def _check(host: str, addresses: Iterable[IPAddress]) -> None:
    for address in addresses:
        reason = refusal(address)
        if reason is not None:
            raise UnsafeHookAddress(f"the host {host} is a {reason} address ({address})")


def check_url(url: str) -> str:
    """Refuse a notify URL that is not http(s), names no host, a port outside 1..65535 or a user
    name or password (the hook would drop them), or whose host is not public (resolved now).
    Returns the URL with its scheme in lower case (schemes are case-insensitive). Only ASCII
    without spaces or control characters: a request line cannot carry anything else (http.client
    refused every delivery to such a URL), so the rest must be percent-encoded (and a host
    name in its IDNA form)."""
    if not url.isascii() or any(c.isspace() or not c.isprintable() for c in url):
        raise UnsafeHookAddress(
            "it must be ASCII without spaces or control characters (percent-encode the rest)"
        )
    try:
        parts = urlsplit(url)
    except ValueError as exc:  # an IPv4 address in brackets, say
        raise UnsafeHookAddress(f"it is not a valid URL ({exc})") from exc
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UnsafeHookAddress("it must be an http(s) URL with a host")
    if "@" in parts.netloc:
        raise UnsafeHookAddress("it must not carry a user name or password")
    try:
        port = parts.port
    except ValueError:
        port = 0
    if port == 0:
        raise UnsafeHookAddress("its port is not a number from 1 to 65535")
    resolve(
        parts.hostname,
        port or (443 if parts.scheme == "https" else 80),
        timeout=settings.HOOK_TIMEOUT_SECONDS,
    )
    return parts.scheme + url[len(parts.scheme) :]


def connect(
    address: tuple[str, int],
    timeout: float | None = None,
    source_address: tuple[str, int] | None = None,
    *,
    deadline: float | None = None,
) -> socket.socket:
    """``socket.create_connection`` that connects only to checked addresses (http.client's
    connection factory: HTTPS still verifies the certificate against the URL's host name). With
    ``deadline`` (``time.monotonic()``), no connection is tried past it, and the socket's timeout
    (which bounds the TLS handshake as a whole) is what is left of it; the name's lookup has
    the deadline too."""
    host, port = address
    error: OSError | None = None
    left = None if deadline is None else deadline - time.monotonic()
    for ip in resolve(host, port, timeout=left):
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no connection to {host} in time")
            timeout = left if timeout is None else min(timeout, left)
        try:
            return socket.create_connection((str(ip), port), timeout, source_address)
        except OSError as exc:
            error = exc
    raise error or OSError(f"cannot connect to {host}")
