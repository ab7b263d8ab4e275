"""Serves the REST API's OpenAPI 3 document (``services/api/openapi.yaml``)
at ``GET /v1/openapi.yaml`` and ``GET /v1/openapi.json``.

The YAML file in the repository is the source of truth; it is read once when
the routes are registered, so a request never touches the disk, and the YAML
route returns the file byte for byte.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web

DOCUMENT_PATH = Path(__file__).with_name("openapi.yaml")
YAML_URL = "/v1/openapi.yaml"
JSON_URL = "/v1/openapi.json"


def load_document(path: Path = DOCUMENT_PATH) -> tuple[bytes, dict[str, Any]]:
    """The file's bytes and its parsed form."""
    raw = path.read_bytes()
    return raw, yaml.safe_load(raw)


class OpenApiDocument:
    def __init__(self, path: Path = DOCUMENT_PATH) -> None:
        self.raw, parsed = load_document(path)
        self.json_text = json.dumps(parsed, separators=(",", ":"))

    def routes(self, app: web.Application) -> None:
        app.router.add_get(YAML_URL, self.serve_yaml)
        app.router.add_get(JSON_URL, self.serve_json)

    async def serve_yaml(self, request: web.Request) -> web.Response:
        return web.Response(body=self.raw, content_type="application/yaml", charset="utf-8")

    async def serve_json(self, request: web.Request) -> web.Response:
        return web.Response(text=self.json_text, content_type="application/json")
