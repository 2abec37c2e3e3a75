"""The API's OpenAPI document, put together from each family's description of its own
operations (`protocol`), and /docs: Swagger UI over it, from files this server serves
(`swagger.py`, no CDN), with the same description as plain HTML for a browser without
JavaScript."""

from __future__ import annotations

import functools
import html
from typing import Any

import orjson

from embedx import __version__
from embedx.server.protocol import admin, openai, rerank, tei
from embedx.server.protocol.schema import Described

FAMILIES = (openai, tei, rerank, admin)


@functools.cache
def openapi_spec(*, keyed: bool, max_items: int, default_model: bool) -> dict[str, Any]:
    """The description of a server with these settings: `keyed` with EMBEDX_API_KEY set,
    taking at most `max_items` texts a request (EMBEDX_MAX_REQUEST_ITEMS), with or without a
    `default_model` for TEI's requests that name none."""
    server = Described(keyed, max_items, default_model)
    paths: dict[str, dict[str, Any]] = {}
    for family in FAMILIES:
        for path, methods in family.operations(server).items():
            paths.setdefault(path, {}).update(methods)  # `/` is TEI's POST and a health GET
    auth = ("Every route but /health needs `Authorization: Bearer <key>` (EMBEDX_API_KEY)."
            if keyed else "This server takes requests without a key.")  # fmt: skip
    spec: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {"title": "embedx", "version": __version__,
                 "description": f"Text embeddings on every GPU of a host. Errors use the "
                                f"OpenAI envelope. {auth} Every GET route also answers HEAD "
                                "with its headers alone."},
        "paths": paths,
    }  # fmt: skip
    if keyed:
        spec["components"] = {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}}
        spec["security"] = [{"bearer": []}]
        paths["/health"]["get"]["security"] = []
    return spec


# Swagger UI, its URLs relative to /docs (so a proxy's path prefix keeps working): the
# document from /openapi.json, and no validator badge (by default it calls a public one)
SWAGGER_UI = """<link rel='stylesheet' href='docs/swagger-ui.css'>
<link rel='icon' type='image/png' href='docs/favicon-32x32.png'>
<script src='docs/swagger-ui-bundle.js'></script>
<script>window.onload = () => { window.ui = SwaggerUIBundle({
  url: 'openapi.json', dom_id: '#swagger-ui', deepLinking: true, validatorUrl: null,
  presets: [SwaggerUIBundle.presets.apis], layout: 'BaseLayout' }); };</script>"""


@functools.cache
def docs_page(*, keyed: bool, max_items: int, default_model: bool) -> str:
    spec = openapi_spec(keyed=keyed, max_items=max_items, default_model=default_model)
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>embedx API</title>",
        SWAGGER_UI,
        "<style>noscript{display:block;font-family:sans-serif;max-width:60em;margin:2em auto;"
        "padding:0 1em} pre{background:#f4f4f4;padding:1em;overflow:auto}</style></head><body>",
        "<div id='swagger-ui'></div><noscript>",
        f"<h1>embedx {html.escape(spec['info']['version'])}</h1>",
        f"<p>{html.escape(spec['info']['description'])} "
        "Machine-readable: <a href='/openapi.json'>/openapi.json</a>.</p>",
    ]
    for path, methods in spec["paths"].items():
        for method, operation in methods.items():
            parts.append(f"<h2>{method.upper()} {html.escape(path)}</h2>")
            parts.append(f"<p>{html.escape(operation['summary'])}</p>")
            if "requestBody" in operation:
                schema = operation["requestBody"]["content"]["application/json"]["schema"]
                parts.append("<h3>Request</h3><pre>" + _pretty(schema) + "</pre>")
            for status, response in operation["responses"].items():
                content: dict[str, Any] = next(iter(response.get("content", {}).values()), {})
                parts.append(f"<h3>{status}: {html.escape(response['description'])}</h3>")
                parts.append("<pre>" + _pretty(content.get("schema", {})) + "</pre>")
    parts.append("</noscript></body></html>")
    return "".join(parts)


def _pretty(schema: Any) -> str:
    return html.escape(orjson.dumps(schema, option=orjson.OPT_INDENT_2).decode())
