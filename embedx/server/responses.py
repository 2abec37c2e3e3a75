"""JSON responses and the OpenAI error envelope, the one shape every error leaves in."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson
from blacksheep import Content, Response, StreamedContent

from embedx.errors import EmbedxError

JSON = b"application/json"
# BlackSheep sends a Content longer than this in slices of this size (`blacksheep/scribe.pyx`)
BLACKSHEEP_SLICE_BYTES = 61440


def json_response(
    payload: Any, status: int = 200, headers: dict[str, str] | None = None
) -> Response:
    return json_bytes_response(
        orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY), status, headers
    )


def json_bytes_response(
    body: bytes, status: int = 200, headers: dict[str, str] | None = None
) -> Response:
    """A response whose JSON body is already serialized, handed to the HTTP server whole."""
    raw = [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    if len(body) <= BLACKSHEEP_SLICE_BYTES:
        return Response(status, raw, Content(JSON, body))

    # Each slice is a copy and a send (a 256-text MiniLM response in base64 takes ten; over
    # ASGI servers each send is awaited on the loop); as the one part of a stream of known
    # length the body takes one, and still carries its content-length.
    async def whole() -> AsyncIterator[bytes]:
        yield body

    return Response(status, raw, StreamedContent(JSON, whole, len(body)))


def error_body(error: EmbedxError) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """Status, headers and body of an error, as the guard sends it."""
    headers = [
        (b"content-type", JSON),
        *((k.encode(), v.encode()) for k, v in error.headers().items()),
    ]
    return error.status, headers, orjson.dumps(error.envelope())
