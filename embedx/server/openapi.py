"""The API's OpenAPI description, its request schemas built from the request checks' own
tables (`validation`), and /docs: the same, as one self-contained page (no CDN)."""

from __future__ import annotations

import functools
import html
from typing import Any

import orjson

from embedx import __version__
from embedx.server.validation import OPENAI, TEI, Family, request_schema

# The builtin catalog's (builtin_models.toml), so every server knows it: the examples' model.
EXAMPLE_MODEL = "sentence-transformers/all-MiniLM-L6-v2"
# What each field means; its type and bounds come from `validation`'s tables.
_SHARED_NOTES = {
    "dimensions": "Matryoshka: keep the first N dimensions, renormalized; at most the "
                  "model's own width.",
    "input_type": "Picks the model's prompt: its catalog entry's, else its "
                  "sentence-transformers config's.",
    "pooling": "Required on a model's first load unless the catalog states it; never "
               "guessed. A different pooling for a loaded model is a 409.",
    "dtype": "First load only. auto: bfloat16 on GPUs that have it, float16 on older GPUs, "
             "float32 on the CPU.",
    "max_seq_len": "Tokens kept per text (longer texts are truncated and counted). Sets it on "
                   "a model's first load; afterwards it must be the model's.",
    "keep_alive": "First load only: idle time before unloading, seconds or a duration like "
                  "10m; 0 unloads when the last user leaves.",
}  # fmt: skip
_OPENAI_NOTES = {
    "model": "A catalog name (GET /v1/models), a Hugging Face repo id or a local directory.",
    "encoding_format": "base64: little-endian float32 bytes.",
    **_SHARED_NOTES,
}
_TEI_NOTES = {
    "model": "Unset, null or blank: EMBEDX_DEFAULT_MODEL, else the first of EMBEDX_PRELOAD "
             "(TEI's clients name no model); required where the server has neither.",
    "prompt_name": "The model's prompt for the texts, as input_type.",
    "normalize": "Unset: EMBEDX_NORMALIZE (true).",
    "truncate": "false: a text over max_seq_len is a 400.",
    "truncation_direction": "Only right truncation.",
    **_SHARED_NOTES,
}  # fmt: skip
_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": "string"},
            },
        }
    },
}
_OPENAI_RESPONSE = {
    "type": "object",
    "required": ["object", "data", "model", "usage"],
    "properties": {
        "object": {"const": "list"},
        "model": {"type": "string"},
        "data": {"type": "array", "items": {
            "type": "object", "required": ["object", "index", "embedding"], "properties": {
                "object": {"const": "embedding"}, "index": {"type": "integer"},
                "embedding": {"oneOf": [{"type": "array", "items": {"type": "number"}},
                                        {"type": "string", "contentEncoding": "base64"}]}}}},
        "usage": {"type": "object", "required": ["prompt_tokens", "total_tokens"],
                  "properties": {"prompt_tokens": {"type": "integer"},
                                 "total_tokens": {"type": "integer"}}},
    },
}  # fmt: skip
_VECTORS = {"type": "array", "items": {"type": "array", "items": {"type": "number"}}}
_OBJECT = {"type": "object"}
_MODEL = {
    "type": "object",
    "required": ["id", "object", "created", "owned_by", "resident", "pooling", "dimensions"],
    "properties": {
        "id": {"type": "string"}, "object": {"const": "model"}, "created": {"type": "integer"},
        "owned_by": {"type": "string"}, "resident": {"type": "boolean"},
        "pooling": {"enum": ["cls", "mean", "last_token", None]},
        "dimensions": {"type": ["integer", "null"], "description": "null until loaded"},
    },
}  # fmt: skip
_MODELS = {
    "type": "object",
    "required": ["object", "data"],
    "properties": {"object": {"const": "list"}, "data": {"type": "array", "items": _MODEL}},
}
_HEALTH = {
    "type": "object",
    "required": ["status"],
    "properties": {
        "status": {"enum": ["ok", "degraded", "failing", "draining"]},
        "quarantined": {"type": "array", "items": {"type": "string"},
                        "description": "model: device (reason), for each device taken out"},
        "failing": {"type": "array", "items": {"type": "string"},
                    "description": "preloaded models that cannot load (status failing, a 503)"},
    },
}  # fmt: skip
_INFO_FIELDS = (("version", "string"), ("uptime_s", "number"), ("settings", "object"),
                ("devices", "array"), ("allocator", "string"), ("requests", "object"),
                ("models", "array"), ("quarantined", "array"))  # fmt: skip
_INFO = {
    "type": "object",
    "required": [key for key, _ in _INFO_FIELDS],
    "properties": {key: {"type": kind} for key, kind in _INFO_FIELDS},
}


def _header(description: str, kind: str = "string") -> dict[str, Any]:
    return {"description": description, "schema": {"type": kind}}


_REQUEST_ID = {"X-Request-Id": _header("The request's id, as the access log names it: the "
                                       "client's own, if it sent a usable one")}  # fmt: skip
_TIMING = {  # TEI's, in whole milliseconds
    "x-tokenization-time": _header("Milliseconds spent tokenizing", "integer"),
    "x-inference-time": _header("Milliseconds from tokenized to embedded", "integer"),
    "x-total-time": _header("Milliseconds in all", "integer"),
    "x-total-tokens": _header("Tokens embedded", "integer"),
}
# What each error status means, and the headers that come with it (errors.py's classes)
_ERRORS: dict[int, tuple[str, dict[str, Any]]] = {
    400: ("Bad input; `param` names the field at fault", {}),
    401: ("Missing or wrong API key",
          {"WWW-Authenticate": _header("Bearer, as RFC 6750 asks")}),
    404: ("Unknown model", {}),
    405: ("Wrong method", {"Allow": _header("The methods the path takes")}),
    408: ("The body did not arrive within EMBEDX_BODY_TIMEOUT_S a MB; the connection closes",
          {"Connection": _header("close")}),
    409: ("Pooling conflict: the model is loaded with another pooling",
          {"x-should-retry": _header("false: the OpenAI SDK retries a 409 unless told not to")}),
    413: ("The body is over EMBEDX_MAX_REQUEST_BYTES", {}),
    415: ("The body is not labelled JSON, or is compressed", {}),
    500: ("A bug in embedx, or every attempt to embed failed; the message names the "
          "request id", {}),
    503: ("Busy, a model that cannot load now, or shutting down",
          {"Retry-After": _header("Seconds to wait before sending it again, where waiting "
                                  "helps", "integer")}),
}  # fmt: skip
# Every route can answer these: the wrong method, a body over the limit or too slow (the edge
# reads a body whatever the method), a bug, and 503 while the server drains.
EVERY_ROUTE = (405, 408, 413, 500, 503)
EMBEDDING = (400, 404, 409, 415)  # a body read and checked, a model found and leased


def _operation(
    summary: str,
    ok: Any,
    *,
    errors: tuple[int, ...] = (),
    keyed: bool,
    request: dict[str, Any] | None = None,
    media: str = "application/json",
    headers: dict[str, Any] | None = None,
    unavailable: Any = _ERROR,
) -> dict[str, Any]:
    """One route's operation: its answer, and every error status it can give (401 where a
    key is set); `unavailable` is its 503's body."""
    responses: dict[str, Any] = {"200": {
        "description": "OK", "headers": {**_REQUEST_ID, **(headers or {})},
        "content": {media: {"schema": ok}}}}  # fmt: skip
    for status in sorted({*errors, *EVERY_ROUTE, *((401,) if keyed else ())}):
        meaning, extra = _ERRORS[status]
        responses[str(status)] = {
            "description": meaning,
            "headers": {**_REQUEST_ID, **extra},
            "content": {"application/json": {"schema": unavailable if status == 503 else _ERROR}},
        }
    operation: dict[str, Any] = {"summary": summary, "responses": responses}
    if request is not None:
        operation["requestBody"] = {"required": True, "content": {"application/json": request}}
    return operation


def _request(family: Family, notes: dict[str, str], **server: Any) -> dict[str, Any]:
    """A family's request body: its schema, described, and an example."""
    schema = request_schema(family, **server)
    for key, note in notes.items():
        schema["properties"][key]["description"] = note  # a note on no field fails here
    if not family.closed:
        schema["description"] = "Fields other than these are ignored, as TEI ignores them."
    texts = ["The food was delicious.", "The waiter was friendly."]
    return {"schema": schema, "example": {"model": EXAMPLE_MODEL, family.texts: texts}}


@functools.cache
def openapi_spec(*, keyed: bool, max_items: int, default_model: bool) -> dict[str, Any]:
    """The description of a server with these settings: `keyed` with EMBEDX_API_KEY set,
    taking at most `max_items` texts a request (EMBEDX_MAX_REQUEST_ITEMS), with or without a
    `default_model` for TEI's requests that name none."""
    spec = _spec(keyed, max_items, default_model)
    paths = spec["paths"]
    for openai in ("/v1/embeddings", "/v1/models", "/v1/models/{model}"):  # as infinity serves
        alias = openai.removeprefix("/v1")
        paths[alias] = {
            method: {
                **operation,
                "summary": f"As {openai}: infinity's path (a base URL without /v1)",
            }
            for method, operation in paths[openai].items()
        }
    return spec


def _spec(keyed: bool, max_items: int, default_model: bool) -> dict[str, Any]:
    server = {"max_items": max_items, "default_model": default_model}
    openai = _request(OPENAI, _OPENAI_NOTES, **server)
    tei = _request(TEI, _TEI_NOTES, **server)
    embedding: dict[str, Any] = {"errors": EMBEDDING, "keyed": keyed, "headers": _TIMING}
    auth = ("Every route but /health needs `Authorization: Bearer <key>` (EMBEDX_API_KEY)."
            if keyed else "This server takes requests without a key.")  # fmt: skip
    spec: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {"title": "embedx", "version": __version__,
                 "description": f"Text embeddings on every GPU of a host. Errors use the "
                                f"OpenAI envelope. {auth} Every GET route also answers HEAD "
                                "with its headers alone."},
        "paths": {
            "/v1/embeddings": {"post": _operation(
                "Create embeddings (OpenAI)", _OPENAI_RESPONSE, request=openai, **embedding)},
            "/v1/models": {"get": _operation(
                "Models resident and in the catalog (OpenAI)", _MODELS, keyed=keyed)},
            "/v1/models/{model}": {"get": {**_operation(
                "One model, resident or in the catalog (OpenAI)", _MODEL, errors=(404,),
                keyed=keyed),
                "parameters": [{"name": "model", "in": "path", "required": True,
                                "schema": {"type": "string"}, "example": EXAMPLE_MODEL,
                                "description": "Slashes as they are or percent-encoded."}]}},
            "/embed": {"post": _operation(
                "Embed (text-embeddings-inference)", _VECTORS, request=tei, **embedding)},
            "/": {"post": _operation(
                "As /embed: TEI serves its model's task here", _VECTORS, request=tei,
                **embedding),
                  "get": _operation("As /health, as in TEI (with the key, if one is set)",
                                    _HEALTH, keyed=keyed,
                                    unavailable={"anyOf": [_HEALTH, _ERROR]})},
            "/health": {"get": _operation(
                "ok, degraded (a device quarantined), failing (a preloaded model cannot load) "
                "or draining; never needs a key", _HEALTH, keyed=False, unavailable=_HEALTH)},
            "/info": {"get": _operation(
                "Settings, devices, concurrency and resident models", _INFO, keyed=keyed)},
            "/metrics": {"get": _operation("Prometheus metrics", {"type": "string"},
                                           media="text/plain", keyed=keyed)},
            "/openapi.json": {"get": _operation("This description", _OBJECT, keyed=keyed)},
            "/docs": {"get": _operation("This description as a page", {"type": "string"},
                                        media="text/html", keyed=keyed)},
        },
    }  # fmt: skip
    if keyed:
        spec["components"] = {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}}
        spec["security"] = [{"bearer": []}]
        spec["paths"]["/health"]["get"]["security"] = []
    return spec


@functools.cache
def docs_page(*, keyed: bool, max_items: int, default_model: bool) -> str:
    spec = openapi_spec(keyed=keyed, max_items=max_items, default_model=default_model)
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>embedx API</title>",
        "<style>body{font-family:sans-serif;max-width:60em;margin:2em auto;padding:0 1em}"
        "pre{background:#f4f4f4;padding:1em;overflow:auto}</style></head><body>",
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
    parts.append("</body></html>")
    return "".join(parts)


def _pretty(schema: Any) -> str:
    return html.escape(orjson.dumps(schema, option=orjson.OPT_INDENT_2).decode())
