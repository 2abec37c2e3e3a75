"""The embedding routes: OpenAI's /v1/embeddings and /v1/models, TEI's /embed."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import orjson
from blacksheep import Request, Response

from embedx.engine import EmbedOptions, EmbedResult
from embedx.errors import ModelNotFound
from embedx.registry import Resident
from embedx.server.responses import json_bytes_response, json_response
from embedx.server.state import ServerState
from embedx.server.validation import (
    EmbedRequest,
    check_json_body,
    parse_openai,
    parse_tei,
    tei_default,
)
from embedx.untrusted import shown


async def _run(
    state: ServerState, request: EmbedRequest, base64_items: Base64Items | None = None
) -> EmbedResult:
    """Lease the model (loading it on first use), wait for a slot, embed. In that order: a
    request waiting for its model's load holds no slot that another model's requests need."""
    options = EmbedOptions(
        dimensions=request.dimensions,
        normalize=request.normalize,
        truncate=request.truncate,
        input_type=request.input_type,
        base64=request.base64,
        sink=base64_items,
    )
    async with state.registry.lease(request.model, request.load) as engine, state.admission.slot():
        return await engine.embed(request.texts, options)


async def create_embeddings(state: ServerState, http: Request) -> Response:
    request = parse_openai(await _json_body(http), state.settings.max_request_items)
    if not request.base64:
        result = await _run(state, request)
        data = [{"object": "embedding", "index": i, "embedding": row}
                for i, row in enumerate(result.vectors)]  # fmt: skip
        payload = {"object": "list", "data": data, "model": request.model, "usage": _usage(result)}
        return json_response(payload, headers=_timing(result))
    # The SDK's default, and the bulk of a busy server's responses: the engine writes each
    # row's base64 (made on the device) straight into its item of the response, laid out
    # before the rows exist, not a Python object per row.
    items = Base64Items()
    result = await _run(state, request, items)
    rest = orjson.dumps({"model": request.model, "usage": _usage(result)})
    return json_bytes_response(items.body(rest[1:]), headers=_timing(result))


async def _json_body(http: Request) -> bytes:
    check_json_body(
        http.get_first_header(b"content-type"), http.get_first_header(b"content-encoding")
    )
    return await http.read() or b""


def _usage(result: EmbedResult) -> dict[str, int]:
    return {"prompt_tokens": result.tokens, "total_tokens": result.tokens}


ITEM_HEAD = b'{"object":"embedding","index":'
ITEM_MID = b',"embedding":"'
ITEM_END = np.frombuffer(b'"},', np.uint8)


class Base64Items:
    """The `data` list of a base64 response, one fixed-width line of bytes per item, made
    before the rows exist: as the request's `EmbedOptions.sink`, it hands the engine the column
    each row's base64 goes in, so a row is copied once from the device's buffer to the body.

    An index with fewer digits than the last is preceded by spaces, between the items, so
    that every row's base64 starts in the same column."""

    def __init__(self) -> None:
        self._lines: np.ndarray | None = None

    def __call__(self, count: int, width: int) -> np.ndarray:
        heads = _item_heads(count)
        row_start = heads.shape[1]
        lines = np.empty((count, row_start + width + len(ITEM_END)), np.uint8)
        lines[:, :row_start] = heads
        lines[:, -len(ITEM_END) :] = ITEM_END
        self._lines = lines
        return lines[:, row_start : row_start + width]

    def body(self, rest: bytes) -> bytes:
        """The response: the items, then `rest`, the fields after `data` (from `"model"` on,
        with the closing brace)."""
        assert self._lines is not None, "the engine wrote no rows"
        items = self._lines.reshape(-1).data[:-1]  # no comma after the last item
        return b"".join((b'{"object":"list","data":[', items, b"],", rest))


@functools.lru_cache(maxsize=8)  # requests mostly come in a few sizes
def _item_heads(count: int) -> np.ndarray:
    """What precedes each of `count` items' base64, padded to one width."""
    width = len(ITEM_HEAD) + len(str(count - 1)) + len(ITEM_MID)
    heads = b"".join((b"%s%d%s" % (ITEM_HEAD, i, ITEM_MID)).rjust(width) for i in range(count))
    return np.frombuffer(heads, np.uint8).reshape(count, width)


async def embed_tei(state: ServerState, http: Request) -> Response:
    settings = state.settings
    request = parse_tei(await _json_body(http), settings.max_request_items, tei_default(settings))
    result = await _run(state, request)
    return json_response(result.vectors, headers=_timing(result))


def _timing(result: EmbedResult) -> dict[str, str]:
    """TEI's timing headers, in whole milliseconds as TEI sends them: where a request's time
    went."""
    return {
        "x-tokenization-time": str(int(result.tokenize_s * 1000)),
        "x-inference-time": str(int((result.total_s - result.tokenize_s) * 1000)),
        "x-total-time": str(int(result.total_s * 1000)),
        "x-total-tokens": str(result.tokens),
    }


async def list_models(state: ServerState, http: Request) -> Response:
    if http.url.path.endswith(b"/"):  # the router lets /v1/models/ through here: no name
        raise ModelNotFound("GET /v1/models/ names no model; GET /v1/models lists them")
    resident = {r.spec.name: r for r in state.registry.residents()}
    names = sorted(set(state.registry.catalog) | set(resident))
    data = [_model_card(state, name, resident) for name in names]
    return json_response({"object": "list", "data": data})


async def retrieve_model(state: ServerState, http: Request) -> Response:
    """GET /v1/models/{model}: the OpenAI SDK's `models.retrieve`. Names like `org/model`
    arrive with their slash percent-encoded by the SDK, or as is from curl: both match."""
    name = http.route_values["model"] or ""  # always there: the route has {model}
    resident = {r.spec.name: r for r in state.registry.residents()}
    if name not in resident and name not in state.registry.catalog:
        raise ModelNotFound(
            f"model '{shown(name)}' is neither in this server's catalog nor loaded; "
            "GET /v1/models lists those",
            param="model",
        )
    return json_response(_model_card(state, name, resident))


def _model_card(state: ServerState, name: str, resident: dict[str, Resident]) -> dict[str, Any]:
    """One model in OpenAI's shape, with what embedx knows of it."""
    entry = resident.get(name)
    engine = entry.engine if entry is not None else None
    spec = entry.spec if entry is not None else state.registry.catalog[name]
    return {
        "id": name,
        "object": "model",
        "created": int(state.started_at),
        "owned_by": "embedx",
        "resident": engine is not None,
        "pooling": spec.pooling.value if spec.pooling else None,
        "dimensions": engine.dimensions if engine is not None else None,
    }
