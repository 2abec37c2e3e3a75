"""JSON responses and the OpenAI error envelope, the one shape every error leaves in."""

from __future__ import annotations

from typing import Any

import orjson
from blacksheep import Content, Response

from embedx.errors import EmbedxError

JSON = b"application/json"


def json_response(
    payload: Any, status: int = 200, headers: dict[str, str] | None = None
) -> Response:
    return json_bytes_response(
        orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY), status, headers
    )


def json_bytes_response(
    body: bytes, status: int = 200, headers: dict[str, str] | None = None
) -> Response:
    """A response whose JSON body is already serialized."""
    raw = [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    return Response(status, raw, Content(JSON, body))


def error_response(error: EmbedxError) -> Response:
    return json_response(error.envelope(), error.status, error.headers())


def error_body(error: EmbedxError) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """Status, headers and body of an error, for the ASGI edge (outside BlackSheep)."""
    headers = [
        (b"content-type", JSON),
        *((k.encode(), v.encode()) for k, v in error.headers().items()),
    ]
    return error.status, headers, orjson.dumps(error.envelope())
