"""Identities that cannot collide, and the small hygiene items: list scope, chunked bodies,
metrics auth, cache headers, deploy settings, the docs page and the ledger CSV."""

from __future__ import annotations

import http.client
import json
import re
import unicodedata
import uuid
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.core.management import call_command
from django.db import connection
from django.test import Client, override_settings

from admission.models import AdmissionPolicy
from admission.views import csv_cell
from queues import services
from queues.models import Endpoint, looks_like_uuid
from switchboard.core.errors import InvalidArgument
from tests.api.conftest import Api, human_token
from tests.conftest import FIXTURE, Personas

# --- identities ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "slug",
    [
        "8365d247-9c0e-4e7f-ba48-c86fcc698927",
        "aba7d9c4c8614a848f1de2b331c67e2d",
        "0123abcd-0123-abcd-0123-0123456789ab",
    ],
)
def test_a_slug_shaped_like_an_id_is_refused(personas: Personas, slug: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        services.endpoint_vend(
            actor=FIXTURE, owner=personas.owner, name="n", queues=["inbox"], slug=slug
        )
    assert caught.value.field == "slug"
    api = Api(Client(), human_token(personas.owner))
    response = api.post("/api/v1/endpoints", {"name": "n", "queues": ["inbox"], "slug": slug})
    assert (response.status_code, response.json()["field"]) == (400, "slug")


def test_a_name_shaped_like_an_id_gets_a_slug_that_is_not(personas: Personas) -> None:
    endpoint, _ = services.endpoint_vend(
        actor=FIXTURE, owner=personas.owner, name=str(uuid.uuid4()), queues=["inbox"]
    )
    assert not looks_like_uuid(endpoint.slug)


def test_a_taken_slug_is_a_conflict_naming_the_field(personas: Personas) -> None:
    api = Api(Client(), human_token(personas.owner))
    body = {"name": "Night shift", "queues": ["inbox"], "slug": "night"}
    assert api.post("/api/v1/endpoints", body).status_code == 201
    again = api.post("/api/v1/endpoints", {**body, "name": "Other"})
    assert again.status_code == 409, again.content
    assert (again.json()["code"], again.json()["field"]) == ("conflict", "slug")
    assert "slug 'night' is taken" in again.json()["error"]
    assert Endpoint.objects.filter(name="Other").count() == 0
    # Unchosen, a taken slug is made free with a suffix, as before.
    unchosen = api.post("/api/v1/endpoints", {"name": "Night", "queues": ["inbox"]})
    assert unchosen.status_code == 201
    assert re.fullmatch(r"night-[0-9a-f]{6}", unchosen.json()["endpoint"]["slug"])


@pytest.mark.parametrize(
    "name",
    [
        unicodedata.normalize("NFC", "Café Crème"),
        unicodedata.normalize("NFD", "Café Crème"),
        "ＣＡＦÉ crème",  # fullwidth
    ],
    ids=["composed", "decomposed", "fullwidth"],
)
def test_names_that_read_the_same_get_the_same_slug(personas: Personas, name: str) -> None:
    # A composed é cut the word ("caf-cr-me"), a decomposed one kept it ("cafe-creme").
    endpoint, _ = services.endpoint_vend(
        actor=FIXTURE, owner=personas.owner, name=name, queues=["inbox"]
    )
    assert endpoint.slug == "cafe-creme"
    assert endpoint.name == name  # the name itself is kept as given


@pytest.mark.parametrize(
    ("name", "slug"),
    [("Straße Nord", "strasse-nord"), ("Øst side", "ost-side"), ("Œuvre/Æther", "oeuvre-aether")],
)
def test_letters_with_no_accent_to_drop_are_spelled_out(
    personas: Personas, name: str, slug: str
) -> None:
    # NFKD alone dropped them: "Straße" gave "strae", "Øst" gave "st".
    endpoint, _ = services.endpoint_vend(
        actor=FIXTURE, owner=personas.owner, name=name, queues=["inbox"]
    )
    assert endpoint.slug == slug


def test_an_id_shaped_reference_resolves_by_id(personas: Personas) -> None:
    # A row from before the rule: Alice's endpoint slug spells Bob's endpoint id.
    alice, bob = personas.agent, personas.foreign
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE queues_endpoint SET slug = %s WHERE id = %s", [str(bob.id), alice.id]
        )
    api = Api(Client(), human_token(personas.admin))
    response = api.client.put(
        f"/api/v1/admission/endpoint:{bob.id}/inbox",
        json.dumps({"max_in_flight": 3}),
        content_type="application/json",
        headers=api._headers(),
    )
    assert response.status_code in (200, 201), response.content
    assert AdmissionPolicy.objects.get().endpoint_id == bob.id


# --- scope --------------------------------------------------------------------------------------


def test_list_todos_on_a_queue_outside_the_scope_is_403(agent_api: Api) -> None:
    response = agent_api.verb("list_todos", {"queue": "elsewhere"})
    assert (response.status_code, response.json()["code"]) == (403, "forbidden")
    assert agent_api.verb("list_todos", {"queue": "inbox"}).status_code == 200


# --- bodies -------------------------------------------------------------------------------------


# 2.5 MiB is read into memory by switchboard.asgi; 3 MiB is past Django's in-memory upload size,
# where the server spools the body to a file as Django does.
@pytest.mark.parametrize("chunks", [40, 48])
def test_a_chunked_body_over_one_mebibyte_is_the_413_json(
    tx_personas: Personas, live_url: str, chunks: int
) -> None:
    token = tx_personas.agent_token
    url = urlsplit(live_url)
    conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=30)
    chunk = b"x" * 65536
    conn.putrequest("POST", "/api/v1/agent/create_todo")
    conn.putheader("Authorization", f"Bearer {token}")
    conn.putheader("Content-Type", "application/json")
    conn.putheader("Transfer-Encoding", "chunked")
    conn.endheaders()
    for _ in range(chunks):  # no Content-Length
        conn.send(b"%x\r\n%s\r\n" % (len(chunk), chunk))
    conn.send(b"0\r\n\r\n")
    response = conn.getresponse()
    body = json.loads(response.read())
    conn.close()
    assert response.status == 413, body
    assert (body["code"], body["field"]) == ("invalid_argument", "body")


# --- metrics, caching, deploy, docs -------------------------------------------------------------


@pytest.mark.parametrize("scheme", ["Bearer", "bearer", "BEARER"])
def test_metrics_accepts_the_scheme_in_any_case(client: Client, scheme: str) -> None:
    response = client.get("/metrics", headers={"Authorization": f"{scheme} test-metrics-token"})
    assert response.status_code == 200
    assert client.get("/metrics", headers={"Authorization": "bearer wrong"}).status_code == 401


def test_signed_in_pages_and_token_answers_are_never_cached(
    personas: Personas, agent_api: Api
) -> None:
    client = Client()
    client.force_login(personas.owner)
    for path in ("/", "/queues", "/ledger", "/ledger.csv"):
        response = client.get(path)
        assert response.status_code == 200, path
        assert response["Cache-Control"] == "no-store", path
    assert agent_api.verb("list_todos").headers["Cache-Control"] == "no-store"
    assert "Cache-Control" not in Client().get("/api/v1/openapi.json")


def test_the_deploy_check_is_clean_with_the_tls_settings(capsys: Any) -> None:
    with override_settings(
        SECURE_SSL_REDIRECT=True,
        SECURE_HSTS_SECONDS=31536000,
        SECURE_HSTS_INCLUDE_SUBDOMAINS=True,
        SECURE_HSTS_PRELOAD=True,
        SESSION_COOKIE_SECURE=True,
        CSRF_COOKIE_SECURE=True,
        DEBUG=False,
        SECRET_KEY="x" * 64 + "unguessable-and-long-enough-for-the-deploy-check",
        # As production is given them (a run with DATABASE_URL and REDIS_URL set is one).
        GIVEN_IN_ENVIRONMENT=frozenset({"SECRET_KEY", "LEDGER_KEY", "SWITCHBOARD_PUBLIC_URL"}),
    ):
        call_command("check", "--deploy", "--fail-level", "WARNING")


def test_the_settings_turn_on_hsts_and_the_redirect(client: Client) -> None:
    with override_settings(SECURE_SSL_REDIRECT=True, SECURE_HSTS_SECONDS=3600):
        assert client.get("/login/").status_code == 301
        secure = client.get("/login/", secure=True)
        assert secure["Strict-Transport-Security"] == "max-age=3600"


def test_the_api_docs_load_no_cdn_and_no_inline_script(client: Client) -> None:
    page = client.get("/api/v1/docs")
    assert page.status_code == 200
    html = page.content.decode()
    assert "cdn." not in html and "jsdelivr" not in html
    assert "unsafe-inline" not in page["Content-Security-Policy"]
    assert "/static/ninja/swagger-ui-bundle.js" in html
    # Our copy of ninja's page (templates/ninja/swagger.html): its language, and the document
    # Swagger UI renders inside the page's main landmark.
    assert '<html lang="en">' in html and '<main><div id="swagger-ui"></div></main>' in html
    asset = client.get("/static/ninja/swagger-ui-init.js")
    asset.close()  # a file response: closing closes its file
    assert asset.status_code == 200


# --- the ledger CSV -----------------------------------------------------------------------------


@pytest.mark.parametrize("cell", ["=1+1", "+1", "-1", "@SUM(A1)", "\tx", "\rx"])
def test_a_csv_cell_that_looks_like_a_formula_is_neutralised(cell: str) -> None:
    assert csv_cell(cell) == "'" + cell


def test_ordinary_csv_cells_are_untouched() -> None:
    assert [csv_cell(c) for c in ("inbox", 3, "a=b", "")] == ["inbox", 3, "a=b", ""]


def test_the_ledger_csv_neutralises_a_name_that_starts_like_a_formula(
    personas: Personas,
) -> None:
    from django.contrib.auth.models import Permission, User

    from queues.access import HumanActor
    from queues.pauses import queue_pause

    evil = User.objects.create_user("@evil", password="pw-evil-123")
    evil.user_permissions.add(Permission.objects.get(codename="pause_queue"))
    queue_pause(actor=HumanActor(User.objects.get(pk=evil.pk)), queue="inbox", reason="r")
    client = Client()
    client.force_login(personas.admin)
    response = client.get("/ledger.csv")
    text = b"".join(response.streaming_content).decode()  # type: ignore[attr-defined]
    assert ",'@evil," in text
    assert ",@evil," not in text


def test_the_document_states_what_every_operation_may_answer(personas: Personas) -> None:
    """An unknown query parameter is 400 and a dependency down is 503 on every operation; the
    document listed neither on most (GET /api/v1/queues: 200, 401, 403), and no Retry-After or
    ETag header anywhere."""
    from switchboard.api import api

    document = api.get_openapi_schema()
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            answers = {str(code): answer for code, answer in operation["responses"].items()}
            assert {"400", "503"} <= set(answers), (method, path)
            if method in ("post", "put"):
                assert "413" in answers, (method, path)
            for limited in ("429", "503"):
                if limited in answers:
                    assert "Retry-After" in answers[limited]["headers"], (method, path, limited)
    budget = document["paths"]["/api/v1/admission/{scope}/{queue}"]
    assert "ETag" in budget["get"]["responses"][200]["headers"]
    # What it says of an operation that took no parameter holds.
    response = Client().get(
        "/api/v1/queues?verbose=1",
        headers={"Authorization": f"Bearer {human_token(personas.admin)}"},
    )
    assert response.status_code == 400 and response.json()["field"] == "verbose"


def _defaults_breaking_their_rules(schemas: dict[str, Any]) -> list[str]:
    """Each property whose default its own schema refuses (length, bounds, pattern, enum)."""
    broken = []
    for name, component in schemas.items():
        for prop, schema in component.get("properties", {}).items():
            if "default" not in schema or schema["default"] is None:
                continue
            value = schema["default"]
            if isinstance(value, str):
                size = len(value)
                fits = schema.get("minLength", 0) <= size <= schema.get("maxLength", size)
                if not fits or ("pattern" in schema and not re.search(schema["pattern"], value)):
                    broken.append(f"{name}.{prop}")
            elif isinstance(value, int | float) and not isinstance(value, bool):
                low, high = schema.get("minimum", value), schema.get("maximum", value)
                if not low <= value <= high:
                    broken.append(f"{name}.{prop}")
            if "enum" in schema and value not in schema["enum"]:
                broken.append(f"{name}.{prop}")
    return broken


def test_every_default_the_document_and_the_tools_declare_keeps_its_own_rules() -> None:
    """``EndpointPatchIn.name`` declared ``default: ""`` beside ``minLength: 1``: a client
    filling in defaults sent a name the server refuses."""
    from switchboard.api import api
    from switchboard.core.verbs import load_verbs

    document = api.get_openapi_schema()
    assert _defaults_breaking_their_rules(document["components"]["schemas"]) == []
    tools = {name: spec.input.model_json_schema() for name, spec in load_verbs().items()}
    assert _defaults_breaking_their_rules(tools) == []
