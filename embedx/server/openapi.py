"""The API's OpenAPI description, and /docs: the same, as one self-contained page (no CDN)."""

from __future__ import annotations

import functools
import html
from typing import Any

import orjson

from embedx import __version__

_LOAD_FIELDS: dict[str, Any] = {
    "pooling": {"type": "string", "enum": ["cls", "mean", "last_token"],
                "description": "Required on a model's first load unless the catalog states it; "
                               "never guessed. A different pooling for a loaded model is a 409."},
    "dtype": {"type": "string", "enum": ["auto", "float32", "float16", "bfloat16"],
              "description": "First load only. auto: bfloat16 on GPUs that have it, float16 "
                             "on older GPUs, float32 on the CPU."},
    "max_seq_len": {"type": "integer", "minimum": 2,
                    "description": "First load only: tokens kept per text (longer texts are "
                                   "truncated and counted)."},
    "keep_alive": {"oneOf": [{"type": "number", "minimum": 0}, {"type": "string"}],
                   "description": "First load only: idle time before unloading, seconds or "
                                  "a duration like 10m; 0 unloads when the last user leaves."},
    "input_type": {"type": "string", "enum": ["query", "passage"],
                   "description": "Picks the model's prompt: its catalog entry's, else its "
                                  "sentence-transformers config's."},
}  # fmt: skip
_TEXTS = {"oneOf": [{"type": "string", "minLength": 1},
                    {"type": "array", "items": {"type": "string", "minLength": 1},
                     "minItems": 1}]}  # fmt: skip
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
_OPENAI_REQUEST = {
    "type": "object",
    "required": ["model", "input"],
    "additionalProperties": False,
    "properties": {
        "model": {"type": "string"},
        "input": _TEXTS,
        "encoding_format": {"type": "string", "enum": ["float", "base64"], "default": "float",
                            "description": "base64: little-endian float32 bytes."},
        "dimensions": {"type": "integer", "minimum": 1,
                       "description": "Matryoshka: keep the first N dimensions, renormalized."},
        "user": {"type": "string"},
        **_LOAD_FIELDS,
    },
}  # fmt: skip
_OPENAI_RESPONSE = {
    "type": "object",
    "properties": {
        "object": {"const": "list"},
        "model": {"type": "string"},
        "data": {"type": "array", "items": {"type": "object", "properties": {
            "object": {"const": "embedding"}, "index": {"type": "integer"},
            "embedding": {"oneOf": [{"type": "array", "items": {"type": "number"}},
                                    {"type": "string", "contentEncoding": "base64"}]}}}},
        "usage": {"type": "object", "properties": {"prompt_tokens": {"type": "integer"},
                                                   "total_tokens": {"type": "integer"}}},
    },
}  # fmt: skip
_TEI_REQUEST = {
    "type": "object",
    "required": ["inputs"],
    "description": "Fields other than these are ignored, as TEI ignores them.",
    "properties": {
        "model": {"type": "string", "description": "Unset: EMBEDX_DEFAULT_MODEL, else the "
                  "first of EMBEDX_PRELOAD (TEI's clients name no model)."},
        "inputs": _TEXTS,
        "prompt_name": {"enum": ["query", "passage", None],
                        "description": "The model's prompt for the texts, as input_type."},
        "normalize": {"type": "boolean", "description": "Unset: EMBEDX_NORMALIZE (true)."},
        "truncate": {"type": "boolean", "default": False,
                     "description": "false: a text over max_seq_len is a 400."},
        "truncation_direction": {"enum": ["right", "Right", None],
                                 "description": "Only right truncation; null means right."},
        "dimensions": {"type": "integer", "minimum": 1},
        **_LOAD_FIELDS,
    },
}  # fmt: skip
_VECTORS = {"type": "array", "items": {"type": "array", "items": {"type": "number"}}}
_OBJECT = {"type": "object"}
_MODEL = {
    "type": "object",
    "properties": {
        "id": {"type": "string"}, "object": {"const": "model"}, "created": {"type": "integer"},
        "owned_by": {"type": "string"}, "resident": {"type": "boolean"},
        "pooling": {"enum": ["cls", "mean", "last_token", None]},
        "dimensions": {"type": ["integer", "null"], "description": "null until loaded"},
    },
}  # fmt: skip
_MODELS = {
    "type": "object",
    "properties": {"object": {"const": "list"}, "data": {"type": "array", "items": _MODEL}},
}
_HEALTH = {
    "type": "object",
    "properties": {
        "status": {"enum": ["ok", "degraded", "failing", "draining"]},
        "quarantined": {"type": "array", "items": {"type": "string"},
                        "description": "model: device (reason), for each device taken out"},
        "failing": {"type": "array", "items": {"type": "string"},
                    "description": "preloaded models that cannot load (status failing, a 503)"},
    },
}  # fmt: skip
_INFO = {
    "type": "object",
    "properties": {key: {"type": kind} for key, kind in (
        ("version", "string"), ("uptime_s", "number"), ("settings", "object"),
        ("devices", "array"), ("allocator", "string"), ("requests", "object"),
        ("models", "array"), ("quarantined", "array"))},
}  # fmt: skip


# Every route can answer these: the wrong method, and a bug (its message names the request id)
ALWAYS = (405, 500)
_RETRY_AFTER = {"Retry-After": {"description": "Seconds to wait before sending it again",
                                "schema": {"type": "integer"}}}  # fmt: skip


def _errors(*statuses: int) -> dict[str, Any]:
    meaning = {400: "Bad input", 401: "Missing or wrong API key", 404: "Unknown model",
               405: "Wrong method (Allow names the right ones)", 409: "Pooling conflict",
               413: "Body too large", 415: "Body not labelled JSON, or compressed",
               500: "A bug in embedx; the message names the request id",
               503: "Busy, loading failed, or shutting down"}  # fmt: skip
    responses: dict[str, Any] = {}
    for status in statuses:
        response = {"description": meaning[status],
                    "content": {"application/json": {"schema": _ERROR}}}  # fmt: skip
        if status == 503:
            response["headers"] = _RETRY_AFTER
        responses[str(status)] = response
    return responses


def _operation(
    summary: str,
    response: Any,
    *,
    request: Any = None,
    errors: tuple[int, ...] = (401,),
    media: str = "application/json",
) -> dict[str, Any]:
    operation: dict[str, Any] = {
        "summary": summary,
        "responses": {"200": {"description": "OK", "content": {media: {"schema": response}}},
                      **_errors(*errors, *ALWAYS)},
    }  # fmt: skip
    if request is not None:
        operation["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": request}},
        }
    return operation


@functools.cache
def openapi_spec() -> dict[str, Any]:
    spec = _spec()
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


def _spec() -> dict[str, Any]:
    embedding_errors = (400, 401, 404, 409, 413, 415, 503)
    return {
        "openapi": "3.1.0",
        "info": {"title": "embedx", "version": __version__,
                 "description": "Text embeddings on every GPU of a host. Errors use the OpenAI "
                                "envelope. With EMBEDX_API_KEY set, every route but /health "
                                "needs `Authorization: Bearer <key>`. Every GET route also "
                                "answers HEAD with its headers alone."},
        "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
        "security": [{"bearer": []}],
        "paths": {
            "/v1/embeddings": {"post": _operation(
                "Create embeddings (OpenAI)", _OPENAI_RESPONSE, request=_OPENAI_REQUEST,
                errors=embedding_errors)},
            "/v1/models": {"get": _operation(
                "Models resident and in the catalog (OpenAI)", _MODELS)},
            "/v1/models/{model}": {"get": {**_operation(
                "One model, resident or in the catalog (OpenAI)", _MODEL, errors=(401, 404)),
                "parameters": [{"name": "model", "in": "path", "required": True,
                                "schema": {"type": "string"},
                                "description": "Slashes as they are or percent-encoded."}]}},
            "/embed": {"post": _operation(
                "Embed (text-embeddings-inference)", _VECTORS, request=_TEI_REQUEST,
                errors=embedding_errors)},
            "/": {"post": _operation(
                "As /embed: TEI serves its model's task here", _VECTORS, request=_TEI_REQUEST,
                errors=embedding_errors),
                  "get": _operation("As /health, as in TEI", _HEALTH, errors=(503,))},
            "/health": {"get": {**_operation(
                "ok, degraded (a device quarantined), failing (a preloaded model cannot load) "
                "or draining", _HEALTH, errors=(503,)), "security": []}},
            "/info": {"get": _operation(
                "Settings, devices, concurrency and resident models", _INFO)},
            "/metrics": {"get": _operation("Prometheus metrics", {"type": "string"},
                                           media="text/plain")},
            "/openapi.json": {"get": _operation("This description", _OBJECT)},
            "/docs": {"get": _operation("This description as a page", {"type": "string"},
                                        media="text/html")},
        },
    }  # fmt: skip


@functools.cache
def docs_page() -> str:
    spec = openapi_spec()
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
