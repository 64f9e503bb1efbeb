"""The OpenAPI document lists every route the app serves, under its API's tag, with its request
body and answers: the check walks the app's routes (an included router's too), so a route added
without its documentation fails it."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.routing import iter_route_contexts

from service.http.app import create_app
from tests.service.api.conftest import small_settings

# Served but not API operations, each for its reason:
NOT_OPERATIONS = {
    # FastAPI's document itself and the pages that show it
    ("GET", "/openapi.json"),
    ("GET", "/docs"),
    ("GET", "/docs/oauth2-redirect"),
    ("GET", "/redoc"),
    ("GET", "/metrics"),  # Prometheus' text format, for its scraper (docs/api.md lists the metrics)
    ("GET", "/"),  # the playground: a web page (POST / is TEI's root, documented)
}


@pytest.fixture(scope="module")
def document_and_routes() -> tuple[dict[str, Any], set[tuple[str, str]]]:
    app = create_app(small_settings(playground=True))
    served = {
        (method, context.path)
        for context in iter_route_contexts(list(app.routes))
        for method in context.methods or ()
        if method != "HEAD" and context.path is not None
    }
    return app.openapi(), served


def test_every_route_is_in_the_openapi_document(
    document_and_routes: tuple[dict[str, Any], set[tuple[str, str]]],
) -> None:
    document, served = document_and_routes
    listed = {(method.upper(), path) for path, item in document["paths"].items() for method in item}
    assert served >= NOT_OPERATIONS  # each exception is still served, and still needs its reason
    assert served - NOT_OPERATIONS - listed == set()
    assert listed <= served


def operation(document: dict[str, Any], method: str, path: str) -> dict[str, Any]:
    found: dict[str, Any] = document["paths"][path][method.lower()]
    return found


def answer_schema(document: dict[str, Any], method: str, path: str, status: str) -> Any:
    return operation(document, method, path)["responses"][status]["content"]["application/json"]["schema"]


@pytest.mark.parametrize(
    "method, path, tag",
    [
        ("POST", "/v2/translate", "deepl"),
        ("POST", "/v2/glossaries", "deepl"),
        ("POST", "/v2/document", "deepl"),
        ("POST", "/v2/document/{document_id}/result", "deepl"),
        ("POST", "/embed", "tei"),
        ("POST", "/", "tei"),
        ("POST", "/translate", "libretranslate"),
        ("POST", "/v1/translate", "translate"),
    ],
)
def test_each_api_s_routes_are_under_its_tag(
    document_and_routes: tuple[dict[str, Any], set[tuple[str, str]]], method: str, path: str, tag: str
) -> None:
    assert operation(document_and_routes[0], method, path)["tags"] == [tag]


def test_deepl_s_bodies_and_answers_are_described(
    document_and_routes: tuple[dict[str, Any], set[tuple[str, str]]],
) -> None:
    document = document_and_routes[0]
    upload = operation(document, "POST", "/v2/document")["requestBody"]["content"]
    form = upload["multipart/form-data"]["schema"]
    assert form["required"] == ["file", "target_lang"]
    assert form["properties"]["file"] == {"type": "string", "format": "binary"}
    assert form["properties"]["source_lang"]["maxLength"] == 16
    translate = operation(document, "POST", "/v2/translate")["requestBody"]["content"]
    assert set(translate) == {"application/json", "application/x-www-form-urlencoded", "multipart/form-data"}
    assert answer_schema(document, "POST", "/v2/translate", "200") == {
        "$ref": "#/components/schemas/DeepLTranslateResponse"
    }
    assert answer_schema(document, "POST", "/v2/document", "200") == {
        "$ref": "#/components/schemas/DeepLDocumentHandle"
    }
    assert answer_schema(document, "POST", "/v2/translate", "403") == {
        "$ref": "#/components/schemas/DeepLErrorBody"
    }
    result = operation(document, "POST", "/v2/document/{document_id}/result")["responses"]["200"]
    assert set(result["content"]) == {"application/octet-stream"}
    query = operation(document, "GET", "/v2/languages")["parameters"]
    assert [p["name"] for p in query] == ["type"]
