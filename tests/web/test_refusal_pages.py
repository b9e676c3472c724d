"""A refusal made before any view ran, or a dependency that did not answer, as a person reads
it: a page naming what happened (503 with Retry-After in an outage), rendered without the
database; to htmx the message alone with ``HX-Reswap: none``, so the page keeps what it shows.
A machine's paths keep the error object. (The browser's side: tests/browser/test_request_failures.)"""

from __future__ import annotations

import logging
import sys
from typing import Any

from django.core.exceptions import PermissionDenied
from django.http import HttpResponse
from django.test import Client
from django.utils.log import log_response

from queues.models import QueuePause
from switchboard.middleware import refusals_without_tracebacks
from tests.conftest import Personas, database_down, push
from tests.web.conftest import signed_in

OUTAGE = "the database did not answer in time; nothing was changed, retry later"


def test_a_console_page_in_an_outage_is_a_page_saying_so(tx_personas: Personas) -> None:
    client = signed_in(tx_personas.owner)
    with database_down():
        response = client.get("/queues/inbox?state=pending")
    assert response.status_code == 503
    assert response["Content-Type"].startswith("text/html")
    assert int(response["Retry-After"]) >= 1
    page = response.content.decode()
    assert "<h1>Switchboard cannot answer right now</h1>" in page
    assert f"<p>{OUTAGE}</p>" in page
    assert '<a href="/queues/inbox?state=pending">load this page again</a>' in page
    assert '"code"' not in page  # not the error object


def test_each_request_an_outage_refuses_is_a_warning_not_an_error(tx_personas: Personas) -> None:
    client = signed_in(tx_personas.owner)
    with database_down():
        refused = client.get("/queues/inbox")
    assert refused.status_code == 503
    # Logged as Django logs every response of 500 or more, onto a logger of the test's own and
    # through the console handler's filter itself: in CI a test before this one leaves the root
    # logger's handlers and django.request's records elsewhere (a Celery worker's setup).
    caught: list[logging.LogRecord] = []
    logger = logging.getLogger("tests.outage")
    logger.addHandler(_Caught(caught))
    logger.setLevel(logging.DEBUG)
    logger.propagate = False  # the record as logged, before any handler's filter
    try:
        answered = HttpResponse(status=refused.status_code)  # as the outage answered it
        log_response("%s: %s", answered.reason_phrase, "/queues/inbox", response=answered,
                     logger=logger)  # fmt: skip
    finally:
        logger.handlers.clear()
    (record,) = caught
    assert record.levelname == "ERROR"  # as Django logs it
    assert refusals_without_tracebacks(record)
    assert record.levelname == "WARNING" and record.getMessage().startswith("Service Unavailable")


class _Caught(logging.Handler):
    def __init__(self, into: list[logging.LogRecord]) -> None:
        super().__init__()
        self.into = into

    def emit(self, record: logging.LogRecord) -> None:
        self.into.append(record)


def test_signing_in_during_an_outage_is_a_page_too(tx_personas: Personas) -> None:
    client = Client()
    with database_down():
        response = client.post("/login/", {"username": "olive", "password": "whatever"})
    assert response.status_code == 503
    assert response["Content-Type"].startswith("text/html")
    assert "Switchboard cannot answer right now" in response.content.decode()


def test_a_pause_sent_by_htmx_in_an_outage_is_its_message_and_no_swap(
    tx_personas: Personas,
) -> None:
    push(tx_personas)
    client = signed_in(tx_personas.pauser)
    with database_down():
        response = client.post(
            "/queues/inbox/pause", {"reason": "upgrading"}, headers={"HX-Request": "true"}
        )
    assert response.status_code == 503
    assert response["HX-Reswap"] == "none"
    assert response.content.decode() == f"<p>{OUTAGE}</p>"
    assert not QueuePause.objects.exists()


def test_a_nul_in_a_page_form_is_a_page_naming_the_field(personas: Personas) -> None:
    client = signed_in(personas.pauser)
    response = client.post("/queues/inbox/pause", {"reason": "up\x00grade"})
    assert response.status_code == 400
    assert response["Content-Type"].startswith("text/html")
    page = response.content.decode()
    assert "<h1>The request was refused</h1>" in page
    assert "<p>reason: " in page and "Nothing was changed" in page
    fragment = client.post(
        "/queues/inbox/pause", {"reason": "up\x00grade"}, headers={"HX-Request": "true"}
    )
    assert fragment.status_code == 400 and fragment["HX-Reswap"] == "none"
    assert fragment.content.decode().startswith("<p>reason: ")
    assert not QueuePause.objects.exists()


def test_a_machines_paths_keep_the_error_object(personas: Personas) -> None:
    client = signed_in(personas.owner)
    for path in ("/api/v1/todos?queue=in%00box", "/metrics?x=%00"):
        response = client.get(path)
        assert response.status_code == 400, path
        assert response["Content-Type"] == "application/json", path
        assert response.json()["code"] == "invalid_argument", path


def test_a_form_sent_with_a_stale_csrf_token_is_a_page_saying_to_reload(
    personas: Personas,
) -> None:
    # Django's own page ("CSRF verification failed … DEBUG=True"), which htmx swapped over the
    # queue list the form was in.
    client = signed_in(personas.pauser, enforce_csrf_checks=True)
    client.cookies["csrftoken"] = "A" * 32
    stale = {"reason": "upgrading", "csrfmiddlewaretoken": "B" * 32}
    page = client.post("/queues/inbox/pause", stale)
    assert page.status_code == 403 and page["Content-Type"].startswith("text/html")
    assert "This page is out of date" in page.content.decode()
    assert "DEBUG" not in page.content.decode()
    fragment = client.post("/queues/inbox/pause", stale, headers={"HX-Request": "true"})
    assert fragment.status_code == 403 and fragment["HX-Reswap"] == "none"
    assert fragment.content.decode().startswith("<p>This page is out of date")
    assert not QueuePause.objects.exists()


def test_an_admin_page_refused_is_the_consoles_page_and_logs_no_traceback(
    personas: Personas,
) -> None:
    auditor = personas.auditor
    auditor.is_staff = True  # as an auditor who reads the admin is
    auditor.save()
    response = signed_in(auditor).get("/admin/queues/endpoint/add/")
    assert response.status_code == 403
    page = response.content.decode()
    assert "<h1>Not allowed</h1>" in page and "Auditors read" in page
    assert 'href="/"' in page  # the console's menu: a way back
    # Django logs the refusal with PermissionDenied's traceback; the console's handler drops it.
    record = logging.LogRecord(
        "django.request", logging.WARNING, __file__, 1, "Forbidden", (), None
    )
    try:
        raise PermissionDenied
    except PermissionDenied:
        record.exc_info = sys.exc_info()
    (handler,) = [h for h in logging.getLogger().handlers if h.filters]
    assert handler.filter(record) and record.exc_info is None
    assert "Traceback" not in handler.format(record)


def test_a_host_not_allowed_is_refused_in_one_warning_line_without_a_traceback(
    personas: Personas, caplog: Any
) -> None:
    # Django logs a bad Host as an ERROR of django.security with its stack: a scanner sending
    # one per request filled the server's log with tracebacks of a client's mistake.
    (handler,) = [h for h in logging.getLogger().handlers if h.filters]
    for path in ("/mcp/any-endpoint", "/api/v1/agent/claim_next", "/queues"):
        caplog.clear()
        response = Client(HTTP_HOST="evil.example.com").post(path, "{}", "application/json")
        assert response.status_code == 400, path
        (record,) = [r for r in caplog.records if r.name.startswith("django.security")]
        assert handler.filter(record)
        line = handler.format(record)
        assert "Traceback" not in line and "\n" not in line, line
        assert record.levelname == "WARNING" and "evil.example.com" in line


def test_an_unknown_page_and_a_forms_address_opened_are_pages(personas: Personas) -> None:
    client = signed_in(personas.owner)
    missing = client.get("/nope")
    assert missing.status_code == 404
    assert "There is no page at /nope." in missing.content.decode()
    assert "<h1>Not found</h1>" in missing.content.decode()
    opened = client.get("/queues/inbox/pause")  # a reload or a bookmark of a form's address
    assert opened.status_code == 405 and opened["Allow"] == "POST"
    assert "This address is for a form&#x27;s POST" in opened.content.decode()
    api = client.get("/api/v1/nope")
    assert api.status_code == 404 and api.json()["code"] == "not_found"


def test_a_form_of_too_many_fields_is_a_page_naming_the_body_not_the_host(
    personas: Personas, settings: Any
) -> None:
    # Django's TooManyFieldsSent reached its 400 handler: text/plain blaming the Host, and an
    # ERROR traceback in the log.
    fields = {f"a{i}": "1" for i in range(settings.DATA_UPLOAD_MAX_NUMBER_FIELDS + 1)}
    response = Client().post("/login/", fields)
    assert response.status_code == 400 and response["Content-Type"].startswith("text/html")
    page = response.content.decode()
    assert "<h1>The request was refused</h1>" in page
    assert f"body: more than {settings.DATA_UPLOAD_MAX_NUMBER_FIELDS} fields" in page
    assert "host" not in page
    query = Client().get("/login/?" + "&".join(f"q{i}=1" for i in range(1001)))
    assert query.status_code == 400 and "query: more than" in query.content.decode()
    api = Client().get("/api/v1/todos?" + "&".join(f"q{i}=1" for i in range(1001)))
    assert api.status_code == 400 and api.json()["field"] == "query"
