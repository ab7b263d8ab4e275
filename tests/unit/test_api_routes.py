"""The routes table (services/api/routes.py), the OpenAPI document and
docs/ports-and-endpoints.md name exactly the same REST routes.

tests/integration/test_openapi.py checks the document against the routes a
live api registers; this checks the table itself against both documents,
without a server, so a route added to one and not the others fails here.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import yaml

from services.api.openapi import DOCUMENT_PATH
from services.api.routes import ROUTES, Route
from services.api.trailing_slash import TrailingSlashRedirect

DOCS = Path(__file__).resolve().parents[2] / "docs" / "ports-and-endpoints.md"
METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
# `METHOD[|METHOD...] /path` inside backticks; a path may hold "{uuid or name}" and stops at "?" or a space.
DOC_ROUTE = re.compile(
    r"`((?:GET|POST|PUT|PATCH|DELETE)(?:\|(?:GET|POST|PUT|PATCH|DELETE))*) (/(?:[^`\s?{]|\{[^}]*\})*)"
)
NOT_IN_TABLE = {("GET", "/metrics")}  # added by build_app, as on every Ferrum HTTP server


def normalize(path: str) -> str:
    """Placeholders compare equal whatever they are called; "/v1/" is "/v1"."""
    return re.sub(r"\{[^}]*\}", "{}", path).rstrip("/") or "/"


def table_routes(routes: tuple[Route, ...] = ROUTES) -> set[tuple[str, str]]:
    """(method, path) of each route a client can call; "*" routes answer GET (any other method is a 405)."""
    return {
        ("GET" if r.method == "*" else r.method, normalize(r.path))
        for r in routes
        if r.resource is not TrailingSlashRedirect
    }


def expand_doc_path(path: str) -> list[str]:
    """`/a[/b]` is /a and /a/b; a segment `x|y` is x or y."""
    variants = [path]
    while any("[" in v for v in variants):
        variants = [
            expanded
            for v in variants
            for expanded in (
                (re.sub(r"\[([^\]]*)\]", "", v, count=1), re.sub(r"\[([^\]]*)\]", r"\1", v, count=1))
                if "[" in v
                else (v,)
            )
        ]
    paths = []
    for variant in variants:
        choices = [segment.split("|") if "{" not in segment else [segment] for segment in variant.split("/")]
        paths += ["/".join(parts) for parts in itertools.product(*choices)]
    return paths


def documented_routes(markdown: str) -> set[tuple[str, str]]:
    section = markdown.split("## REST routes", 1)[1].split("\n## ", 1)[0]
    found = set()
    for methods, path in DOC_ROUTE.findall(section):
        for method in methods.split("|"):
            for expanded in expand_doc_path(path):
                found.add((method, normalize(expanded)))
    return found


def openapi_routes() -> set[tuple[str, str]]:
    document = yaml.safe_load(DOCUMENT_PATH.read_bytes())
    return {
        (method.upper(), normalize(path))
        for path, item in document["paths"].items()
        for method in item
        if method != "parameters"
    }


def test_the_table_lists_what_the_openapi_document_documents() -> None:
    table = table_routes()
    assert len(table) > 100
    assert table - openapi_routes() == set(), "in the routes table, not in openapi.yaml"
    assert openapi_routes() - table == set(), "in openapi.yaml, not in the routes table"


def test_the_table_lists_what_ports_and_endpoints_md_lists() -> None:
    documented = documented_routes(DOCS.read_text())
    table = table_routes()
    assert table - documented == set(), "in the routes table, not in docs/ports-and-endpoints.md"
    assert documented - table - NOT_IN_TABLE == set(), "in docs/ports-and-endpoints.md, not in the routes table"


def test_the_docs_parser_reads_the_notation_it_is_given() -> None:
    markdown = (
        "## REST routes\n"
        "- `GET|POST /v1/things`, `GET /v1/things/{uuid or name}[/detail]?limit=..`\n"
        "- `DELETE /v1/volume/connectors|targets/{id}` (1.32), `POST` alone, `/v1/no-method`\n"
        "## Next section\n- `GET /v1/elsewhere`\n"
    )
    assert documented_routes(markdown) == {
        ("GET", "/v1/things"),
        ("POST", "/v1/things"),
        ("GET", "/v1/things/{}"),
        ("GET", "/v1/things/{}/detail"),
        ("DELETE", "/v1/volume/connectors/{}"),
        ("DELETE", "/v1/volume/targets/{}"),
    }


def test_every_version_gate_is_a_microversion_above_the_minimum() -> None:
    gated = [r for r in ROUTES if r.since is not None]
    assert gated, "the table gates no route"
    for route in gated:
        assert route.since is not None and route.since[0] == 1 and route.since > (1, 1), route
    assert all(r.method in (*METHODS, "*") for r in ROUTES)
