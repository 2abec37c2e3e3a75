"""What every family's OpenAPI description is made of: the server's facts it depends on, the
error envelope, the statuses errors come with and their headers, and one operation."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from embedx.server.protocol.family import Family, request_schema

# The builtin catalog's (builtin_models.toml), so every server knows it: the examples' model.
EXAMPLE_MODEL = "sentence-transformers/all-MiniLM-L6-v2"


@dataclass(frozen=True, slots=True)
class Described:
    """The settings the description depends on: whether a key is needed, how many texts a
    request takes, whether TEI's requests may name no model."""

    keyed: bool
    max_items: int
    default_model: bool


ERROR = {
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


def header(description: str, kind: str = "string") -> dict[str, Any]:
    return {"description": description, "schema": {"type": kind}}


REQUEST_ID = {"X-Request-Id": header("The request's id, as the access log names it: the "
                                     "client's own, if it sent a usable one")}  # fmt: skip
TIMING = {  # TEI's, in whole milliseconds, on every embedding route's answer
    "x-tokenization-time": header("Milliseconds spent tokenizing", "integer"),
    "x-inference-time": header("Milliseconds from tokenized to embedded", "integer"),
    "x-total-time": header("Milliseconds in all", "integer"),
    "x-total-tokens": header("Tokens embedded", "integer"),
}
# What each error status means, and the headers that come with it (errors.py's classes)
ERRORS: dict[int, tuple[str, dict[str, Any]]] = {
    400: ("Bad input; `param` names the field at fault", {}),
    401: ("Missing or wrong API key",
          {"WWW-Authenticate": header("Bearer, as RFC 6750 asks")}),
    404: ("Unknown model", {}),
    405: ("Wrong method", {"Allow": header("The methods the path takes")}),
    408: ("The body did not arrive within EMBEDX_BODY_TIMEOUT_S a MB; the connection closes",
          {"Connection": header("close")}),
    409: ("Pooling conflict: the model is loaded with another pooling",
          {"x-should-retry": header("false: the OpenAI SDK retries a 409 unless told not to")}),
    413: ("The body is over EMBEDX_MAX_REQUEST_BYTES", {}),
    415: ("The body is not labelled JSON, or is compressed", {}),
    500: ("A bug in embedx, or every attempt to embed failed; the message names the "
          "request id", {}),
    503: ("Busy, a model that cannot load now, or shutting down",
          {"Retry-After": header("Seconds to wait before sending it again, where waiting "
                                 "helps", "integer")}),
}  # fmt: skip
# Every route can answer these: the wrong method, a body over the limit or too slow (the guard
# reads a body whatever the method), a bug, and 503 while the server drains.
EVERY_ROUTE = (405, 408, 413, 500, 503)
EMBEDDING = (400, 404, 409, 415)  # a body read and checked, a model found and leased


def operation(
    summary: str,
    ok: Any,
    *,
    keyed: bool,
    errors: tuple[int, ...] = (),
    request: dict[str, Any] | None = None,
    media: str = "application/json",
    headers: dict[str, Any] | None = None,
    unavailable: Any = ERROR,
) -> dict[str, Any]:
    """One route's operation: its answer, and every error status it can give (401 where a
    key is set); `unavailable` is its 503's body."""
    responses: dict[str, Any] = {"200": {
        "description": "OK", "headers": {**REQUEST_ID, **(headers or {})},
        "content": {media: {"schema": ok}}}}  # fmt: skip
    for status in sorted({*errors, *EVERY_ROUTE, *((401,) if keyed else ())}):
        meaning, extra = ERRORS[status]
        responses[str(status)] = {
            "description": meaning,
            "headers": {**REQUEST_ID, **extra},
            "content": {"application/json": {"schema": unavailable if status == 503 else ERROR}},
        }
    described: dict[str, Any] = {"summary": summary, "responses": responses}
    if request is not None:
        described["requestBody"] = {"required": True, "content": {"application/json": request}}
    return described


def embedding(
    summary: str, ok: Any, family: Family, server: Described, model: str = EXAMPLE_MODEL
) -> dict[str, Any]:
    """An embedding route's operation: its family's request body, with an example (naming
    `model`), its answer with TEI's timing headers, and the errors of a body checked and a
    model leased."""
    schema = request_schema(family, max_items=server.max_items, default_model=server.default_model)
    texts = ["The food was delicious.", "The waiter was friendly."]
    request = {"schema": schema, "example": {"model": model, family.texts: texts}}
    return operation(summary, ok, keyed=server.keyed, errors=EMBEDDING, request=request,
                     headers=TIMING)  # fmt: skip
