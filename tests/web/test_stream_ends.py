"""What a streamed response leaves behind when it ends or its client goes away: nothing.

A real uvicorn in this process (tests/inprocess.py) serves real HTTP clients; the tests read the
server's own state: its open request tasks, the doorbell's attached streams and watchers, and the
database connections its threads took from the pool.

- Every stream (the agent event stream, MCP's GET stream and ``subscriptions/listen``, the
  console's ``/live``) ends with its client: uvicorn drops what is sent after a disconnect
  without an error, so a stream nobody listened for stayed attached for ever.
- The ledger CSV (a synchronous iterator over a server-side cursor) streams in batches and gives
  its connection back, when the download ends and when the client leaves half-way.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from django.db import connection
from django.test import Client

from switchboard import mcp
from switchboard.pgpool import base as pgpool
from tests.conftest import Personas, push
from tests.inprocess import Served, handed_out, idle_in_pool, serving, settle
from tests.mcp.conftest import initialize
from tests.web.conftest import signed_in

STREAMS = 4


@pytest.fixture(scope="module")
def served(django_db_setup: Any) -> Iterator[Served]:
    with serving() as srv:
        yield srv


def _hang_up(response: httpx.Response) -> None:
    """Leave as a departing client does: the server sees the connection end."""
    sock = response.extensions["network_stream"].get_extra_info("socket")
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


@contextlib.contextmanager
def _opened(
    method: str, url: str, *, first: str, skip: int = 0, **kw: Any
) -> Iterator[tuple[httpx.Client, httpx.Response]]:
    """A streamed request whose body has begun: ``skip`` + 1 lines starting with ``first``
    were read."""
    client = httpx.Client(timeout=httpx.Timeout(10.0, read=30.0))
    with client.stream(method, url, **kw) as response:
        assert response.status_code == 200, response.read()
        # Kept: a line iterator closed early (a ``for`` broken over a temporary one, collected)
        # closes the connection, which is a hang-up.
        lines = response.iter_lines()
        for _ in range(skip + 1):
            while not next(lines).startswith(first):
                pass
        try:
            yield client, response
        finally:
            _hang_up(response)
            del lines
    client.close()


def _agent_events(srv: Served, token: str) -> Any:
    headers = {"Authorization": f"Bearer {token}", "Accept": "text/event-stream"}
    return _opened("GET", f"{srv.base}/api/v1/agent/events", first=": attached", headers=headers)


def _mcp_get_stream(srv: Served, p: Personas) -> Any:
    url = f"{srv.base}/mcp/{p.agent.slug}"
    headers = {
        "Authorization": f"Bearer {p.agent_token}",
        "Accept": "application/json, text/event-stream",
    }
    init = httpx.post(url, json=initialize(), headers=headers)
    assert init.status_code == 200, init.text
    headers |= {
        "Mcp-Session-Id": init.headers["Mcp-Session-Id"],
        "MCP-Protocol-Version": "2025-11-25",
    }
    done = httpx.post(
        url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers
    )
    assert done.status_code == 202
    # The first todo waits, so the stream's first event (the attach ring) proves it attached.
    return _opened("GET", url, first="data:", headers=headers)


def _mcp_listen(srv: Served, p: Personas) -> Any:
    body = {
        "jsonrpc": "2.0",
        "id": "listen-1",
        "method": "subscriptions/listen",
        "params": {
            "notifications": {"resourceSubscriptions": [mcp.TODO_URI]},
            "_meta": {mcp.PROTOCOL_VERSION_KEY: "2026-07-28", mcp.CLIENT_CAPABILITIES_KEY: {}},
        },
    }
    headers = {
        "Authorization": f"Bearer {p.agent_token}",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2026-07-28",
        "Mcp-Method": "subscriptions/listen",
    }
    # The acknowledgement, then the attach ring of the waiting todo: attached.
    url = f"{srv.base}/mcp/{p.agent.slug}"
    return _opened("POST", url, first="data:", skip=1, json=body, headers=headers)


OPENERS = {
    "agent_events": lambda srv, p: _agent_events(srv, p.agent_token),
    "mcp_get_stream": _mcp_get_stream,
    "mcp_listen": _mcp_listen,
}


@pytest.mark.parametrize("kind", sorted(OPENERS))
def test_an_agent_stream_whose_client_left_is_detached_and_ends(
    tx_personas: Personas, served: Served, kind: str
) -> None:
    p = tx_personas
    push(p, 1)  # waiting: each stream's attach ring shows it attached
    assert served.doorbell()[0] == 0 and served.requests() == 0
    with contextlib.ExitStack() as streams:
        for _ in range(STREAMS):
            streams.enter_context(OPENERS[kind](served, p))
        assert settle(lambda: served.doorbell()[0] == STREAMS), served.doorbell()
        assert served.requests() == STREAMS, served.requests()
    # Hung up: every subscription is gone and every request has ended, long before a keepalive
    # (15 s) would have found the socket closed, if it ever did (uvicorn drops sends silently).
    assert settle(lambda: served.doorbell()[0] == 0, timeout=5), served.doorbell()
    assert settle(lambda: served.requests() == 0, timeout=5), served.requests()


def test_the_live_board_stream_ends_with_its_viewer(
    tx_personas: Personas, served: Served, settings: Any
) -> None:
    settings.LIVE_BOARD_RINGS = True  # so each board also watches the doorbell
    client = Client()
    client.force_login(tx_personas.owner)
    cookies = {"sessionid": client.cookies["sessionid"].value}
    with contextlib.ExitStack() as streams:
        for _ in range(STREAMS):
            streams.enter_context(
                _opened("GET", f"{served.base}/live?here=/", first="retry:", cookies=cookies)
            )
        assert settle(lambda: served.doorbell()[1] == STREAMS), served.doorbell()
        assert served.requests() == STREAMS, served.requests()
    assert settle(lambda: served.doorbell()[1] == 0, timeout=5), served.doorbell()
    assert settle(lambda: served.requests() == 0, timeout=5), served.requests()


def _ledger_rows(n: int) -> None:
    """``n`` more ledger rows on chain 0 (the export reads them; no chain is verified here),
    committed."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            WITH base AS (
                SELECT (SELECT coalesce(max(seq), 0) FROM admission_ledgerentry) AS seq,
                       (SELECT coalesce(max(chain_pos), 0) FROM admission_ledgerentry
                        WHERE chain = 0) AS pos
            )
            INSERT INTO admission_ledgerentry
                (seq, chain, chain_pos, prev_hash, kind, actor_human_name, actor_endpoint_slug,
                 scope, queue, before, after, at, entry_hash)
            SELECT b.seq + i, 0, b.pos + i, repeat('0', 64), 'queue.pause', 'ada', '', 'queue',
                   'inbox', NULL, jsonb_build_object('reason', 'row ' || (b.seq + i)), now(),
                   md5((b.seq + i)::text) || md5('x' || (b.seq + i))
            FROM base b, generate_series(1, %s) AS i
            """,
            [n],
        )


def _auditor_cookies(p: Personas) -> dict[str, str]:
    client = Client()
    client.force_login(p.auditor)
    return {"sessionid": client.cookies["sessionid"].value}


@pytest.fixture
def idle_hook_late(monkeypatch: pytest.MonkeyPatch) -> None:
    """The server's console threads run their idle hook, which gives back any connection the
    thread still holds, a minute after their next request rather than a second (the pool's idle
    window, which they read each time they become idle): a response that never gave its
    connection back would otherwise pass, given back by the hook."""
    monkeypatch.setattr(pgpool, "IDLE_CHECK_SECONDS", 60.0)


def _given_back(taken: list[Any]) -> None:
    """Every connection the export's request took went back to the pool (or was closed, as the
    pool closes one that broke)."""
    assert taken, "the export took no connection from the pool"
    assert settle(lambda: all(raw.closed or idle_in_pool(raw) for raw in taken)), [
        (raw.closed, idle_in_pool(raw)) for raw in taken
    ]


def test_the_ledger_csv_streams_the_same_bytes_and_gives_its_connection_back(
    tx_personas: Personas, served: Served, idle_hook_late: None
) -> None:
    p = tx_personas
    _ledger_rows(5000)  # more than a batch of the export's cursor (2,000)
    client = Client()
    client.force_login(p.auditor)
    expected = b"".join(client.get("/ledger.csv").streaming_content)  # type: ignore[attr-defined]
    cookies = _auditor_cookies(p)
    with handed_out("django_") as taken:  # the server's console threads
        response = httpx.get(f"{served.base}/ledger.csv", cookies=cookies, timeout=30)
        assert settle(lambda: served.requests() == 0)
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/csv; charset=utf-8"
    assert response.content == expected  # what Django's own handler streams
    assert len(response.content.splitlines()) > 5000
    _given_back(taken)


def test_a_ledger_csv_download_left_half_way_stops_and_gives_its_connection_back(
    tx_personas: Personas, served: Served, idle_hook_late: None
) -> None:
    p = tx_personas
    _ledger_rows(60_000)  # megabytes: far more than the socket buffers hold
    cookies = _auditor_cookies(p)
    with handed_out("django_") as taken:
        with _opened("GET", f"{served.base}/ledger.csv", first="seq,", cookies=cookies):
            assert served.requests() == 1
            # The view gave its connection back as it returned; the body's producer took one
            # again (the last taken), and holds it while it sends.
            assert taken and not idle_in_pool(taken[-1])
        assert settle(lambda: served.requests() == 0, timeout=10), served.requests()
    _given_back(taken)


def test_the_live_stream_takes_get_only(personas: Personas) -> None:
    # A PUT or POST to /live used to start a stream like a GET.
    client = signed_in(personas.owner)
    for method in ("POST", "PUT", "DELETE", "HEAD"):
        response = client.generic(method, "/live")
        assert response.status_code == 405 and response["Allow"] == "GET", method
